package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jazzmine/worker/wire"
)

func TestHeadTailKeepsShortTextWholeAndCutsLongTextToItsEnds(t *testing.T) {
	lines := func(from, to int) string {
		var b strings.Builder
		for i := from; i < to; i++ {
			fmt.Fprintf(&b, "%d\n", i)
		}
		return b.String()
	}
	t.Run("short text is whole", func(t *testing.T) {
		s := lines(0, keepLines)
		if got, cut := headTail(s); got != s || cut != nil {
			t.Errorf("headTail of %d lines cut it: %v", keepLines, cut)
		}
	})
	t.Run("200,000 printed numbers keep their first and last lines", func(t *testing.T) {
		s := lines(0, 200000)
		got, cut := headTail(s)
		want := lines(0, cutLines) + fmt.Sprintf("… %d lines (%d bytes) left out …\n", 200000-2*cutLines, len(s)-len(lines(0, cutLines))-len(lines(200000-cutLines, 200000))) + lines(200000-cutLines, 200000)
		if got != want {
			t.Errorf("headTail =\n%.300s\n...\n%.300s\nwant\n%.300s", got, got[len(got)-300:], want)
		}
		if cut == nil || cut.Lines != 200000-2*cutLines {
			t.Errorf("left out %+v", cut)
		}
	})
	t.Run("one 2 MB line keeps its ends", func(t *testing.T) {
		s := strings.Repeat("x", 2_000_000)
		got, cut := headTail(s)
		want := strings.Repeat("x", cutBytes) + "\n… 1 line (1987712 bytes) left out …\n" + strings.Repeat("x", cutBytes)
		if got != want || cut.Bytes != 2_000_000-2*cutBytes {
			t.Errorf("headTail of a 2 MB line: %d bytes, cut %+v", len(got), cut)
		}
	})
	t.Run("a cut never splits a character", func(t *testing.T) {
		s := strings.Repeat("é", 1_000_000)
		got, _ := headTail(s)
		if !strings.HasPrefix(got, strings.Repeat("é", cutBytes/2)+"\n…") || !strings.HasSuffix(got, "…\n"+strings.Repeat("é", cutBytes/2)) {
			t.Errorf("headTail split a character: %q ... %q", got[:20], got[len(got)-20:])
		}
	})
}

// TestSubmitShowsTheHeadAndTailOfALongOutput feeds worker submit's text view the
// events of a script that printed 100,000 lines, then an Out and its end: the first
// lines come as they are printed, then a line says what was left out, then the last
// lines, before the Out; the end carries what the run cost. --json prints every event.
func TestSubmitShowsTheHeadAndTailOfALongOutput(t *testing.T) {
	var events []*wire.Event
	var chunk strings.Builder
	for i := range 100_000 {
		fmt.Fprintf(&chunk, "%d\n", i)
		if chunk.Len() > 30_000 || i == 99_999 {
			events = append(events, &wire.Event{Type: wire.EventStdout, Text: chunk.String()})
			chunk.Reset()
		}
	}
	events = append(events,
		&wire.Event{Type: wire.EventExecuteResult, ExecutionCount: 1, Data: map[string]any{"text/plain": "42"}},
		&wire.Event{Type: wire.EventFinalResult, Data: int64(42)},
		&wire.Event{Type: wire.EventScriptDone, Success: true, DurationMS: 80, CPUMS: 51.25, PeakMemoryBytes: 17 << 20})
	var out strings.Builder
	p := &printer{w: &out}
	for _, ev := range events {
		p.print(ev)
	}
	got := out.String()
	lines := strings.Split(strings.TrimRight(got, "\n"), "\n")
	if len(lines) != 2*cutLines+3 {
		t.Fatalf("%d lines printed, want %d:\n%s", len(lines), 2*cutLines+3, got)
	}
	if !strings.HasPrefix(lines[0], "  stdout        0") || !strings.HasSuffix(lines[cutLines-1], " 59") {
		t.Errorf("the head is not the first %d lines: %q ... %q", cutLines, lines[0], lines[cutLines-1])
	}
	if !strings.Contains(lines[cutLines], "… 99880 lines (") || !strings.HasSuffix(lines[cutLines], "left out … (worker submit --json shows the whole)") {
		t.Errorf("no marker after the head: %q", lines[cutLines])
	}
	if !strings.HasSuffix(lines[2*cutLines], " 99999") || lines[2*cutLines+1] != "                Out[1]: 42" {
		t.Errorf("the tail does not end with the last line before the Out: %q, %q", lines[2*cutLines], lines[2*cutLines+1])
	}
	if want := "done: success in 80 ms; CPU 51.2 ms, peak memory 17.0 MiB (0 bytes of output)"; lines[len(lines)-1] != want {
		t.Errorf("the end %q, want %q", lines[len(lines)-1], want)
	}
}
