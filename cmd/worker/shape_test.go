package main

import (
	"fmt"
	"strings"
	"testing"
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
