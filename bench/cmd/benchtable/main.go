// Command benchtable reads the output of the benchmark processes
// bench/run.sh ran, one file a process, and prints the published table as
// markdown: medians over every process, and ratios with ringfence's
// throughput (or the alternative's time) over the alternative's.
//
//	benchtable FILE...
//
// It fails, printing nothing, if a figure of the table is missing.
package main

import (
	"errors"
	"fmt"
	"os"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(files []string) error {
	if len(files) == 0 {
		return errors.New("usage: benchtable FILE (one a benchmark process)")
	}
	s := newSamples()
	for i, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		err = s.read(f, i)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return table(os.Stdout, s)
}
