// Package examplerun is what every runnable program in examples/ shares, so
// each example shows only its own idea: Main (an interrupt cancels, an
// error exits 1) and UntilSettled, which runs the example's consumer until
// every message it produced is handled or dead-lettered, then stops it.
package examplerun
