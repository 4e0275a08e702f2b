//go:build race

package scope_test

// heapTestKeys is smaller under the race detector, which makes every lookup
// an order of magnitude slower; the normal run uses the full 10 million.
const heapTestKeys = 100_000
