package main

import (
	"os"

	"github.com/ringfence/ringfence/cmd/ringfence/demo"
)

// runDemo runs `ringfence demo`; see package demo.
func runDemo(args []string) int { return demo.Main(args, os.Stdout, os.Stderr) }
