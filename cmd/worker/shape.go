package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jazzmine/worker/wire"
)

// What a model or a person is shown of a long text (stdout, stderr, a traceback): all
// of it up to keepLines lines and keepBytes bytes; past either, its head and its tail,
// each at most cutLines lines and cutBytes bytes, around a line that says what was
// left out. The events keep the whole (up to the job's max_output_bytes); MCP stores
// it as a file, the CLI prints it with --json.
const (
	keepLines = 200
	keepBytes = 16 << 10
	cutLines  = 60
	cutBytes  = 6 << 10
)

// leftOut says what a text lost to its cut: how many of its lines (partly, for the
// two at the edges of the cut) and bytes.
type leftOut struct {
	Lines int `json:"lines"`
	Bytes int `json:"bytes"`
}

func (l leftOut) marker() string {
	lines := "lines"
	if l.Lines == 1 {
		lines = "line"
	}
	return fmt.Sprintf("… %d %s (%d bytes) left out …", l.Lines, lines, l.Bytes)
}

// headTail returns s whole when it is short, else its head, the marker line and its
// tail, and what was left out (nil when nothing was).
func headTail(s string) (string, *leftOut) {
	if len(s) <= keepBytes && strings.Count(s, "\n") <= keepLines {
		return s, nil
	}
	head := linesFromStart(s, cutLines, cutBytes)
	tail := linesFromEnd(s[len(head):], cutLines, cutBytes)
	omitted := s[len(head) : len(s)-len(tail)]
	l := &leftOut{Lines: strings.Count(omitted, "\n"), Bytes: len(omitted)}
	if !strings.HasSuffix(omitted, "\n") {
		l.Lines++ // a line cut in two
	}
	sep := "\n"
	if strings.HasSuffix(head, "\n") {
		sep = ""
	}
	return head + sep + l.marker() + "\n" + tail, l
}

// linesFromStart is the longest prefix of s of at most n lines and max bytes, cut on
// a character boundary.
func linesFromStart(s string, n, max int) string {
	end := 0
	for i := 0; i < n && end < len(s); i++ {
		nl := strings.IndexByte(s[end:], '\n')
		if nl < 0 {
			end = len(s)
			break
		}
		end += nl + 1
	}
	if end > max {
		end = max
		for end > 0 && !utf8.RuneStart(s[end]) {
			end--
		}
	}
	return s[:end]
}

// linesFromEnd is the longest suffix of s of at most n lines and max bytes, cut on a
// character boundary.
func linesFromEnd(s string, n, max int) string {
	body := strings.TrimSuffix(s, "\n") // a last newline ends the last line
	pos := len(body)
	for range n {
		nl := strings.LastIndexByte(body[:pos], '\n')
		if nl < 0 {
			pos = -1
			break
		}
		pos = nl
	}
	start := pos + 1
	if len(s)-start > max {
		start = len(s) - max
		for start < len(s) && !utf8.RuneStart(s[start]) {
			start++
		}
	}
	return s[start:]
}

// valueText is v, a value of wire.Event.Data, as JSON text the way events carry it
// (NaN and infinities null, no HTML escaping), or as Go prints it when it has none.
func valueText(v any) string {
	b, err := wire.ValueJSON(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// valueRaw is v as JSON for a structured output (which encoding/json writes: it
// refuses NaN), or nil when v is nil or has no JSON form.
func valueRaw(v any) json.RawMessage {
	if v == nil {
		return nil
	}
	b, err := wire.ValueJSON(v)
	if err != nil {
		return nil
	}
	return b
}

// outPrompt writes IPython's Out of a value's text/plain, count its execution count:
// on the prompt's line, or below it when it has several lines, as IPython's
// displayhook does.
func outPrompt(b *strings.Builder, count int, text string) {
	if count <= 0 {
		count = 1
	}
	if strings.Contains(text, "\n") {
		fmt.Fprintf(b, "Out[%d]:\n%s\n", count, strings.TrimRight(text, "\n"))
		return
	}
	fmt.Fprintf(b, "Out[%d]: %s\n", count, text)
}

// usageLine is what an execution cost, in one line: CPU time and peak memory, as its
// script_done says them (left out when it says neither).
func usageLine(cpuMS float64, peakBytes int64) string {
	var parts []string
	if cpuMS > 0 {
		parts = append(parts, fmt.Sprintf("CPU %.1f ms", cpuMS))
	}
	if peakBytes > 0 {
		parts = append(parts, fmt.Sprintf("peak memory %.1f MiB", float64(peakBytes)/(1<<20)))
	}
	return strings.Join(parts, ", ")
}
