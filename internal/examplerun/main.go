package examplerun

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
)

// Main is an example program's main: run gets a context that an interrupt
// cancels and writes its report to stdout; its error is printed to stderr
// after the program's name, and the program exits with status 1.
func Main(name string, run func(ctx context.Context, out io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}
