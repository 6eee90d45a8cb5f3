package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/jazzmine/worker/imagebuild"
)

func build(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "config.yaml", "the sandboxes (YAML)")
	if err := fs.Parse(args); err != nil {
		return &exitError{code: 2}
	}
	cfg, err := imagebuild.LoadConfig(*configPath)
	if err != nil {
		return usageError("%v", err)
	}
	docker, err := imagebuild.Connect(ctx)
	if err != nil {
		return err
	}
	defer docker.Close()
	b, err := imagebuild.NewBuilder(imagebuild.BuilderConfig{Docker: docker, Progress: stderr})
	if err != nil {
		return err
	}
	images, err := b.EnsureAll(ctx, cfg)
	if err != nil {
		return err
	}
	for _, name := range cfg.Names() {
		img := images[name]
		state := "up to date"
		if img.Built {
			state = "built"
		}
		fmt.Fprintf(stderr, "%s: %s (%s)\n", name, img.Tag, state)
	}
	return nil
}
