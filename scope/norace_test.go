//go:build !race

package scope_test

// heapTestKeys is the number of distinct keys TestHeapBoundedByDistinctKeys
// streams through a scope.
const heapTestKeys = 10_000_000
