package main

import (
	"context"
	"io"
	"os"
)

func submit(ctx context.Context, args []string, getenv func(string) string, stdin *os.File, stdout, stderr io.Writer) error {
	return usageError("submit: not built yet")
}
