// Package examplerun runs a runnable example's consumer until every message
// the example produced is settled, then stops it: the end every program in
// examples/ shares, kept here so each example shows only its own idea.
package examplerun
