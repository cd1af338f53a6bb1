// Command relay runs the pub/sub relay: `relay serve`, `relay
// migrate`, `relay version`, `relay admin …` (cmd/relay/README.md › Version and admin command line)
// and `relay cert …` (cmd/relay/CLUSTER.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runCommand(ctx, os.Args[1:], os.LookupEnv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		stop()
		os.Exit(exitCode(err))
	}
}

// exitCode is 2 for a command line that cannot run, 1 for any other failure.
func exitCode(err error) int {
	var u usageError
	if errors.As(err, &u) {
		return 2
	}
	return 1
}
