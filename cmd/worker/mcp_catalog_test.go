package main

import (
	"strings"
	"testing"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// TestListSandboxesSaysWhichOneNoWorkerServes: a model reading list_sandboxes learns
// that a sandbox whose image could not be built is unavailable, and why, and is not
// shown tools it does not have.
func TestListSandboxesSaysWhichOneNoWorkerServes(t *testing.T) {
	text := describeSandboxes([]client.SandboxInfo{
		{Sandbox: "default", Python: "3.11.2", Tools: []wire.ToolSpec{{Name: "word_count", Signature: "(text: str) -> int"}}},
		{Sandbox: "ghost", Description: "numpy", Error: `base image "x" not found`, Tools: []wire.ToolSpec{}},
		{Sandbox: "later", Building: true, Tools: []wire.ToolSpec{}},
	})
	for _, want := range []string{"sandbox default\n", "def word_count(text: str) -> int", "sandbox ghost: numpy\n  unavailable: base image \"x\" not found\n",
		"sandbox later\n  its image is being built: a run waits until a worker serves it"} {
		if !strings.Contains(text, want) {
			t.Errorf("list_sandboxes says:\n%s\nwithout %q", text, want)
		}
	}
	if strings.Contains(text[strings.Index(text, "sandbox ghost"):], "Python") {
		t.Errorf("the unavailable sandbox is described as if it served:\n%s", text)
	}
}

// TestTheSandboxListNamesTheDebianAndPipPackages: what a model reads of a sandbox says
// which Debian and pip packages its image has, so that it knows yaml is there.
func TestTheSandboxListNamesTheDebianAndPipPackages(t *testing.T) {
	text := describeSandboxes([]client.SandboxInfo{
		{Sandbox: "data", AptPackages: []string{"python3-numpy", "python3-yaml"}, Packages: []string{"tabulate==0.9"}},
		{Sandbox: "plain"},
	})
	for _, want := range []string{"sandbox data\n", "  Debian packages: python3-numpy, python3-yaml\n", "  pip packages: tabulate==0.9\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("the list lacks %q:\n%s", want, text)
		}
	}
	if strings.Count(text, "packages:") != 2 {
		t.Errorf("a sandbox without packages lists some:\n%s", text)
	}
}
