package wire_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/jazzmine/worker/wire"
)

func TestJobFilesValidate(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(j *wire.Job)
		wantMsg string // empty when the job is valid
	}{
		{name: "inline, by reference and empty files are valid", edit: func(j *wire.Job) {
			j.Files = []wire.File{{Path: "a.csv", Data: []byte("x,y\n")}, {Path: "data/big.csv", Object: "uploads/big", Mode: 0o600}, {Path: "empty"}}
			j.Artifacts = []string{"report.md", "results"}
			j.MaxArtifacts, j.MaxArtifactBytes = wire.MaxArtifactsLimit, wire.MaxArtifactBytesLimit
		}},
		{name: "an absolute path", edit: func(j *wire.Job) { j.Files = []wire.File{{Path: "/etc/passwd"}} },
			wantMsg: `files[0].path "/etc/passwd" is absolute`},
		{name: "a path that leaves the workspace", edit: func(j *wire.Job) { j.Files = []wire.File{{Path: "../x"}} },
			wantMsg: `files[0].path "../x" leaves the workspace`},
		{name: "a path that is not clean", edit: func(j *wire.Job) { j.Files = []wire.File{{Path: "a//b"}} },
			wantMsg: `files[0].path "a//b" is not a clean path`},
		{name: "a path with a NUL", edit: func(j *wire.Job) { j.Files = []wire.File{{Path: "a\x00b"}} },
			wantMsg: `files[0].path "a\x00b" is not valid UTF-8 without NUL`},
		{name: "a path given twice", edit: func(j *wire.Job) { j.Files = []wire.File{{Path: "a"}, {Path: "a"}} },
			wantMsg: `files[1].path "a" is given twice`},
		{name: "both data and object", edit: func(j *wire.Job) { j.Files = []wire.File{{Path: "a", Data: []byte{1}, Object: "o"}} },
			wantMsg: `files[0] has both data and object`},
		{name: "a mode beyond the permission bits", edit: func(j *wire.Job) { j.Files = []wire.File{{Path: "a", Mode: 0o4755}} },
			wantMsg: `files[0].mode 2541 is invalid`},
		{name: "too much inline data", edit: func(j *wire.Job) {
			j.Files = []wire.File{{Path: "a", Data: make([]byte, wire.MaxInlineBytes)}, {Path: "b", Data: []byte{1}}}
		}, wantMsg: `the inline data of files is 262145 bytes, at most 262144 are allowed: put larger files in the object store bucket JAZZMINE_FILES`},
		{name: "too many files", edit: func(j *wire.Job) { j.Files = make([]wire.File, wire.MaxInputFiles+1) },
			wantMsg: `files holds 257 entries, at most 256 are allowed`},
		{name: "an artifact path outside", edit: func(j *wire.Job) { j.Artifacts = []string{"out/../../etc"} },
			wantMsg: `artifacts[0] "out/../../etc" is not a clean path`},
		{name: "max_artifacts over its limit", edit: func(j *wire.Job) { j.MaxArtifacts = wire.MaxArtifactsLimit + 1 },
			wantMsg: `max_artifacts 1025 is invalid`},
		{name: "a negative max_artifact_bytes", edit: func(j *wire.Job) { j.MaxArtifactBytes = -1 },
			wantMsg: `max_artifact_bytes -1 is invalid`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := validJob()
			tt.edit(j)
			err := j.Validate("default", 0)
			switch {
			case tt.wantMsg == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tt.wantMsg != "" && (err == nil || !strings.Contains(err.Error(), tt.wantMsg) || !errors.Is(err, wire.ErrInvalidJob)):
				t.Fatalf("Validate: %v; want an ErrInvalidJob saying %q", err, tt.wantMsg)
			}
		})
	}
}

// TestJobFilesRoundTrip: inline bytes travel as base64 in JSON and as binary
// in msgpack, and come back the same, non-UTF-8 bytes included.
func TestJobFilesRoundTrip(t *testing.T) {
	data := []byte{0xff, 0x00, 'a', 0xc3}
	for _, ct := range []string{wire.ContentTypeJSON, wire.ContentTypeMsgpack} {
		j := validJob()
		j.Files = []wire.File{{Path: "bin/x", Mode: 0o755, Data: data}, {Path: "big.csv", Object: "up/1"}}
		j.Artifacts = []string{"report.md"}
		j.MaxArtifacts, j.MaxArtifactBytes = 3, 1000
		b, err := wire.EncodeJob(ct, j)
		if err != nil {
			t.Fatal(err)
		}
		got, err := wire.DecodeJob(ct, b)
		if err != nil {
			t.Fatalf("%s: %v", ct, err)
		}
		if len(got.Files) != 2 || !bytes.Equal(got.Files[0].Data, data) || got.Files[0].Mode != 0o755 || got.Files[1].Object != "up/1" ||
			got.Artifacts[0] != "report.md" || got.MaxArtifacts != 3 || got.MaxArtifactBytes != 1000 {
			t.Fatalf("%s: got %+v", ct, got)
		}
	}
}

// TestJobFilesTypeErrorsNameTheField: a value of the wrong type inside a
// file is named by where it is, in both encodings.
func TestJobFilesTypeErrorsNameTheField(t *testing.T) {
	_, err := wire.DecodeJob(wire.ContentTypeJSON, []byte(`{"execution_id":"a","script":"x","files":[{"path":7}]}`))
	if err == nil || !strings.Contains(err.Error(), `files`) || !errors.Is(err, wire.ErrMalformed) {
		t.Fatalf("JSON: %v", err)
	}
	// msgpack: {"execution_id":"a","files":[{"path":7}]}
	b := []byte{0x82, 0xac}
	b = append(b, "execution_id"...)
	b = append(b, 0xa1, 'a', 0xa5)
	b = append(b, "files"...)
	b = append(b, 0x91, 0x81, 0xa4)
	b = append(b, "path"...)
	b = append(b, 0x07)
	_, err = wire.DecodeJob(wire.ContentTypeMsgpack, b)
	if err == nil || !strings.Contains(err.Error(), `field "files": element 0: field "path": want a string, got an integer`) {
		t.Fatalf("msgpack: %v", err)
	}
}

func TestEventArtifactRoundTrip(t *testing.T) {
	for _, ct := range []string{wire.ContentTypeJSON, wire.ContentTypeMsgpack} {
		e := &wire.Event{ExecutionID: "a", Type: wire.EventArtifact, Seq: 3, Attempt: 1, Path: "out/c.png",
			Bucket: wire.TenantFilesBucket("alpha"), Object: wire.ObjectPrefix("a", 1) + "out/c.png", Size: 12, SHA256: "ab", ContentType: "image/png"}
		b, err := wire.EncodeEvent(ct, e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := wire.DecodeEvent(ct, b)
		if err != nil {
			t.Fatal(err)
		}
		if got.Path != e.Path || got.Bucket != "JAZZMINE_FILES_alpha" || got.Object != "executions/a/1/out/c.png" || got.Size != 12 || got.SHA256 != "ab" || got.ContentType != "image/png" {
			t.Fatalf("%s: got %+v", ct, got)
		}
	}
}
