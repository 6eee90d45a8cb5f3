//go:build ignore

// aptpackages prints the Debian packages (apt_packages) of a sandbox of a config
// file, separated by spaces. record.sh installs them beside ipython3, so that the
// reference answers with the libraries the sandbox's image has, from one list:
//
//	go run ./cmd/worker/testdata/ipython/aptpackages.go -config examples/config.yaml -sandbox datascience
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/jazzmine/worker/imagebuild"
)

func main() {
	config := flag.String("config", "examples/config.yaml", "the config file")
	sandbox := flag.String("sandbox", "datascience", "the sandbox")
	flag.Parse()
	cfg, err := imagebuild.LoadConfig(*config)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	spec := cfg.Sandboxes[*sandbox]
	if spec == nil || len(spec.AptPackages) == 0 {
		fmt.Fprintf(os.Stderr, "%s: sandbox %q has no apt_packages\n", *config, *sandbox)
		os.Exit(1)
	}
	fmt.Println(strings.Join(spec.AptPackages, " "))
}
