package main

import (
	"io"
	"strings"
	"testing"
)

// TestTheClientCommandsNameTheirServer: submit's and mcp's help name --server and
// NATS_URL, and --server wins over NATS_URL.
func TestTheClientCommandsNameTheirServer(t *testing.T) {
	for _, cmd := range []string{"submit", "mcp"} {
		var help strings.Builder
		_ = run(t.Context(), []string{cmd, "--help"}, func(string) string { return "" }, strings.NewReader(""), io.Discard, &help)
		if !strings.Contains(help.String(), "-server URL") || !strings.Contains(help.String(), "NATS_URL") {
			t.Errorf("%s --help names neither --server nor NATS_URL:\n%s", cmd, help.String())
		}
	}
	var stderr strings.Builder
	env := func(k string) string {
		if k == "NATS_URL" {
			return "nats://127.0.0.1:1"
		}
		return ""
	}
	err := run(t.Context(), []string{"submit", "--server", "nats://127.0.0.1:2", "-e", "1"}, env, strings.NewReader(""), io.Discard, &stderr)
	if err == nil || !strings.Contains(err.Error(), "nats://127.0.0.1:2") {
		t.Errorf("submit --server: %v, want it to have tried nats://127.0.0.1:2", err)
	}
}

// TestServeSaysWhichFlagsNATSURLOverrides: with NATS_URL set, the embedded server's
// flags are ignored, and serve says so.
func TestServeSaysWhichFlagsNATSURLOverrides(t *testing.T) {
	env := func(k string) string {
		if k == "NATS_URL" {
			return "nats://127.0.0.1:1"
		}
		return ""
	}
	f, err := parseServeFlags([]string{"--nats-listen", "127.0.0.1:5555", "--config", "x.yaml"}, env, io.Discard)
	if err != nil || len(f.ignored) != 1 || f.ignored[0] != "--nats-listen" {
		t.Errorf("parseServeFlags: %+v, %v; want --nats-listen said ignored", f, err)
	}
	if f, _ := parseServeFlags([]string{"--nats-listen", "127.0.0.1:5555"}, func(string) string { return "" }, io.Discard); len(f.ignored) != 0 {
		t.Errorf("without NATS_URL, ignored %v", f.ignored)
	}
}
