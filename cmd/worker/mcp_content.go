package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// What run_python puts in its content of the execution's files: each image and
// artifact up to maxInlineFile, all of them up to maxInlineFiles; a larger one is a
// line naming its object and size.
const (
	maxInlineFile  = 1 << 20
	maxInlineFiles = 8 << 20
)

// content is run_python's result as a model reads it, as a notebook shows a cell's:
// a status line (with what the run cost), what it printed, its Out (the value of its
// last expression, with its other forms and image below), its error, traceback and
// hint, its intermediates and logs, what it displayed and the files it left; then the
// images as image content and the artifacts as embedded resources. Long texts are cut
// to their head and tail, the whole stored and linked (cutText). It is an error
// result when the script failed, so that the model sees it did.
func (s *mcpServer) content(ctx context.Context, ss *mcp.ServerSession, res *client.Result, out *runOutput) *mcp.CallToolResult {
	var text strings.Builder
	var extra []mcp.Content
	status(&text, res, out.SessionID)
	if out.Note != "" {
		fmt.Fprintf(&text, "note: %s\n", out.Note)
	}
	section := func(name, body string) {
		if body != "" {
			fmt.Fprintf(&text, "%s:\n%s\n", name, strings.TrimRight(body, "\n"))
		}
	}
	out.Stdout = s.cutText(ctx, ss, res, "stdout", res.Stdout, out, &extra)
	section("stdout", out.Stdout)
	out.Stderr = s.cutText(ctx, ss, res, "stderr", res.Stderr, out, &extra)
	section("stderr", out.Stderr)
	f := fetcher{c: s.c, budget: maxInlineFiles, convs: s.convs, ss: ss}
	if res.Value != nil {
		out.Out = cutForms(res.Value.Data)
		out.Out["text/plain"] = s.cutText(ctx, ss, res, "out", res.Value.Data["text/plain"], out, &extra)
		outPrompt(&text, res.ExecutionCount, out.Out["text/plain"])
		extra = append(extra, forms(fmt.Sprintf("Out[%d]", max(res.ExecutionCount, 1)), out.Out)...)
		if img := res.Value.Image; img != nil {
			c, note := f.image(ctx, img)
			fmt.Fprintf(&text, "  image %s (%s, %d bytes)%s\n", img.Path, img.ContentType, img.Size, note)
			if c != nil {
				extra = append(extra, c)
			}
		}
	}
	if res.FinalData != nil && !res.FinalDataIsValue {
		fmt.Fprintf(&text, "result: %s\n", valueText(res.FinalData))
	}
	if res.FinalDataIsValue {
		out.Result = nil // Out says it: not a second copy
	}
	if !res.Success {
		out.Error = s.cutText(ctx, ss, res, "error", res.Error, out, &extra)
		fmt.Fprintf(&text, "error (%s): %s\n", res.ErrorKind, out.Error)
		out.Traceback = s.cutText(ctx, ss, res, "traceback", res.Traceback, out, &extra)
		section("traceback", out.Traceback)
		if res.Hint != "" {
			fmt.Fprintf(&text, "hint: %s\n", res.Hint)
		}
	}
	for _, i := range res.Intermediates {
		fmt.Fprintf(&text, "intermediate %s: %s\n", i.Label, valueText(i.Data))
	}
	for _, l := range res.Logs {
		fmt.Fprintf(&text, "log %s: %s\n", l.Level, l.Message)
	}
	for i, d := range res.Displays {
		out.Displays[i].Data = cutForms(d.Data)
		fmt.Fprintf(&text, "display %d: %s\n", i+1, out.Displays[i].Data["text/plain"])
		extra = append(extra, forms(fmt.Sprintf("display %d", i+1), out.Displays[i].Data)...)
		if d.Image != nil {
			c, note := f.image(ctx, d.Image)
			out.Displays[i].Image.Included = c != nil
			fmt.Fprintf(&text, "  image %s (%s, %d bytes)%s\n", d.Image.Path, d.Image.ContentType, d.Image.Size, note)
			if c != nil {
				extra = append(extra, c)
			}
		}
	}
	for i := range res.Artifacts {
		a := &res.Artifacts[i]
		c, note := f.resource(ctx, a)
		out.Artifacts[i].Included = c != nil
		fmt.Fprintf(&text, "artifact %s (%s, %d bytes)%s\n", a.Path, a.ContentType, a.Size, note)
		if c != nil {
			extra = append(extra, c)
		}
	}
	return &mcp.CallToolResult{IsError: !res.Success, Content: append([]mcp.Content{&mcp.TextContent{Text: text.String()}}, extra...)}
}

// status writes the result's first line: how it ended, in how long, at what cost.
func status(b *strings.Builder, res *client.Result, session string) {
	if res.Success {
		fmt.Fprintf(b, "success in %s", mcpDuration(res.DurationMS))
	} else {
		fmt.Fprintf(b, "failed (%s) in %s", res.ErrorKind, mcpDuration(res.DurationMS))
	}
	if usage := usageLine(res.CPUMS, res.PeakMemoryBytes); usage != "" {
		fmt.Fprintf(b, "; %s", usage)
	}
	fmt.Fprintf(b, " (execution %s", res.ExecutionID)
	if session != "" {
		fmt.Fprintf(b, ", session %s", session)
	}
	b.WriteString(")\n")
}

// forms are an object's other text forms (Markdown, HTML...), each a text content of
// its own named by what showed them, when its text/plain says nothing of it (the
// default repr, "<Card object at 0x...>"): a DataFrame's text table is all a model
// needs, and its HTML would say it again.
func forms(what string, data map[string]string) []mcp.Content {
	if !defaultRepr.MatchString(data["text/plain"]) {
		return nil
	}
	var out []mcp.Content
	for _, mime := range []string{"text/markdown", "text/html", "text/latex", "application/json"} {
		if form, ok := data[mime]; ok {
			out = append(out, &mcp.TextContent{Text: fmt.Sprintf("%s (%s):\n%s", what, mime, form)})
		}
	}
	return out
}

// defaultRepr matches the text/plain of an object without a repr of its own.
var defaultRepr = regexp.MustCompile(`^<[\w.]+( object)? at 0x[0-9a-f]+>$|^$`)

// cutForms is a copy of an object's text forms each cut to its head and tail.
func cutForms(data map[string]string) map[string]string {
	out := make(map[string]string, len(data))
	for mime, form := range data {
		out[mime], _ = headTail(form)
	}
	return out
}

// cutText returns text whole when it is short, else cut to its head and tail
// (headTail); the whole is then stored in the files bucket and linked, and the cut
// noted in out.
func (s *mcpServer) cutText(ctx context.Context, ss *mcp.ServerSession, res *client.Result, field, text string, out *runOutput, extra *[]mcp.Content) string {
	cut, left := headTail(text)
	if left == nil {
		return text
	}
	note := cutOut{Field: field, leftOut: *left}
	a := &client.Artifact{Path: field + ".txt", Bucket: wire.FilesBucket, Object: "outputs/" + res.ExecutionID + "/" + field + ".txt",
		ContentType: "text/plain; charset=utf-8", Size: int64(len(text))}
	sum := sha256.Sum256([]byte(text))
	a.SHA256 = hex.EncodeToString(sum[:])
	if err := s.c.PutFile(ctx, a.Object, strings.NewReader(text)); err != nil {
		cut = strings.Replace(cut, left.marker(), left.marker()+" (the whole could not be stored: "+err.Error()+")", 1)
	} else {
		note.URI = fileURI(a.Object)
		s.convs.readable(ss, a)
		cut = strings.Replace(cut, left.marker(), left.marker()+" (the whole: "+note.URI+")", 1)
		*extra = append(*extra, &mcp.ResourceLink{URI: note.URI, Name: a.Path, Title: "the whole " + field + " of execution " + res.ExecutionID,
			MIMEType: a.ContentType, Size: &a.Size})
	}
	out.Cut = append(out.Cut, note)
	return cut
}

// fileURI names an object of the files bucket as a resource of this server.
func fileURI(object string) string { return "jazzmine-files:///" + object }

// fetcher downloads the execution's files into the result, within its budget; a file
// it does not include becomes a resource the conversation may read.
type fetcher struct {
	c      *client.Client
	budget int64
	convs  *conversations
	ss     *mcp.ServerSession
}

// fetch downloads a, or says why not (the note of its line).
func (f *fetcher) fetch(ctx context.Context, a *client.Artifact) ([]byte, string) {
	if a.Size > maxInlineFile || a.Size > f.budget {
		f.convs.readable(f.ss, a)
		return nil, fmt.Sprintf(": too large to include, the resource %s", fileURI(a.Object))
	}
	var buf bytes.Buffer
	if err := f.c.Download(ctx, a, &buf); err != nil {
		return nil, fmt.Sprintf(": not included: %v", err)
	}
	f.budget -= a.Size
	return buf.Bytes(), ""
}

// image is a display image as image content (PNG, JPEG) or, SVG being text, an
// embedded resource.
func (f *fetcher) image(ctx context.Context, a *client.Artifact) (mcp.Content, string) {
	data, note := f.fetch(ctx, a)
	if data == nil {
		return nil, note
	}
	if a.ContentType == "image/png" || a.ContentType == "image/jpeg" {
		return &mcp.ImageContent{Data: data, MIMEType: a.ContentType}, ", below"
	}
	return embedded(a, data), ", below"
}

// resource is an artifact as an embedded resource.
func (f *fetcher) resource(ctx context.Context, a *client.Artifact) (mcp.Content, string) {
	data, note := f.fetch(ctx, a)
	if data == nil {
		return nil, note
	}
	return embedded(a, data), ", below"
}

// embedded is a file as an embedded resource: text when it is text, else a blob.
func embedded(a *client.Artifact, data []byte) *mcp.EmbeddedResource {
	r := &mcp.ResourceContents{URI: fileURI(a.Object), MIMEType: a.ContentType}
	if isText(a.ContentType) && utf8.Valid(data) {
		r.Text = string(data)
	} else {
		r.Blob = data
	}
	return &mcp.EmbeddedResource{Resource: r}
}

func isText(contentType string) bool {
	mime, _, _ := strings.Cut(contentType, ";")
	switch mime = strings.TrimSpace(mime); {
	case strings.HasPrefix(mime, "text/"), mime == "image/svg+xml", mime == "application/json", strings.HasSuffix(mime, "+json"), strings.HasSuffix(mime, "+xml"):
		return true
	}
	return false
}

// maxReadFile bounds a file resources/read returns: the whole of an output is at most
// a job's max_output_bytes (16 MiB), an artifact at most the execution's files.
const maxReadFile = 64 << 20

// readFile answers resources/read of a jazzmine-files:/// URI: a file a result of
// this conversation named (cutText, fetcher), read from its bucket. Any other object
// is not found, as if the bucket had no such object.
func (s *mcpServer) readFile(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	object, ok := strings.CutPrefix(uri, "jazzmine-files:///")
	if !ok {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	a, ok := s.convs.file(req.Session, object)
	if !ok {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if a.Size > maxReadFile {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d a read returns", uri, a.Size, maxReadFile)
	}
	var buf bytes.Buffer
	if err := s.c.Download(ctx, &a, &buf); err != nil {
		return nil, fmt.Errorf("read %s: %w", uri, err)
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{embedded(&a, buf.Bytes()).Resource}}, nil
}
