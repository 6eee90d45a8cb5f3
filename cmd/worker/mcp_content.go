package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/jazzmine/worker/client"
)

// What run_python puts in its content of the execution's files: each image and
// artifact up to maxInlineFile, all of them up to maxInlineFiles; a larger one is a
// line naming its object and size.
const (
	maxInlineFile  = 1 << 20
	maxInlineFiles = 8 << 20
)

// content is run_python's result as a model reads it: a text block (status, result as
// JSON, output, error and traceback, intermediates, logs, displays and files), then
// the display images as image content and the artifacts as embedded resources. It
// is an error result when the script failed, so that the model sees it did.
func (s *mcpServer) content(ctx context.Context, res *client.Result, out *runOutput) *mcp.CallToolResult {
	var text strings.Builder
	summarize(&text, res)
	f := fetcher{c: s.c, budget: maxInlineFiles}
	var extra []mcp.Content
	for i, d := range res.Displays {
		fmt.Fprintf(&text, "display %d: %s\n", i+1, d.Data["text/plain"])
		for _, mime := range []string{"text/markdown", "text/html"} {
			if form, ok := d.Data[mime]; ok {
				extra = append(extra, &mcp.TextContent{Text: fmt.Sprintf("display %d (%s):\n%s", i+1, mime, form)})
			}
		}
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

// summarize writes the result's status, data, output, error, intermediates and logs.
func summarize(b *strings.Builder, res *client.Result) {
	if res.Success {
		fmt.Fprintf(b, "success in %s (execution %s)\n", mcpDuration(res.DurationMS), res.ExecutionID)
	} else {
		fmt.Fprintf(b, "failed (%s) in %s (execution %s)\n", res.ErrorKind, mcpDuration(res.DurationMS), res.ExecutionID)
	}
	if res.FinalData != nil {
		fmt.Fprintf(b, "result: %s\n", jsonText(res.FinalData))
	}
	section := func(name, body string) {
		if body != "" {
			fmt.Fprintf(b, "%s:\n%s\n", name, strings.TrimRight(body, "\n"))
		}
	}
	section("stdout", res.Stdout)
	section("stderr", res.Stderr)
	if !res.Success {
		fmt.Fprintf(b, "error (%s): %s\n", res.ErrorKind, res.Error)
		section("traceback", res.Traceback)
	}
	for _, i := range res.Intermediates {
		fmt.Fprintf(b, "intermediate %s: %s\n", i.Label, jsonText(i.Data))
	}
	for _, l := range res.Logs {
		fmt.Fprintf(b, "log %s: %s\n", l.Level, l.Message)
	}
}

// fetcher downloads the execution's files into the result, within its budget.
type fetcher struct {
	c      *client.Client
	budget int64
}

// fetch downloads a, or says why not (the note of its line).
func (f *fetcher) fetch(ctx context.Context, a *client.Artifact) ([]byte, string) {
	if a.Size > maxInlineFile || a.Size > f.budget {
		return nil, fmt.Sprintf(": too large to include, object %s of the bucket %s", a.Object, a.Bucket)
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
	r := &mcp.ResourceContents{URI: "jazzmine-files:///" + a.Object, MIMEType: a.ContentType}
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
