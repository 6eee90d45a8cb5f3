package wire

import (
	"fmt"
	"path"
	"strings"
	"unicode/utf8"
)

// FilesBucket is the NATS Object Store bucket of the contract: agents put
// large input files there and name them in [File.Object]; workers store an
// execution's artifacts and display images there, under [ObjectPrefix].
// Its objects expire with the events (the bucket's TTL is the events' max
// age). On a fleet with tenants, a tenant's artifacts go to a bucket of its
// own, [TenantFilesBucket].
const FilesBucket = "JAZZMINE_FILES"

// TenantFilesBucket is the bucket, in the fleet's account, that holds the
// artifacts and display images of tenant's executions, bounded on its own
// (the workers' tenant_files_max_bytes) so that no tenant fills another's.
// A tenant's account does not reach it: its agents read their objects from
// the workers, a chunk a request, on [SubjectFiles].
func TenantFilesBucket(tenant string) string { return FilesBucket + "_" + tenant }

// Reading a tenant's objects. An agent of a tenant sends a [ChunkRequest] on
// SubjectFiles, jazzmine.files.<tenant> in the fleet's account, and a worker
// answers with the bytes of one chunk of the object in the tenant's
// [TenantFilesBucket]: Content-Type ContentTypeBytes (never an event's), the
// object's size in HeaderObjectSize and where the next chunk is in
// HeaderNextChunk; or, with no bytes, [HeaderError]. Requests are served
// within the tenant's share of the workers' background work, at most 512 a
// second of a tenant on each worker; beyond that the error is [Busy].
const (
	SubjectFiles     = "jazzmine.files"
	ContentTypeBytes = "application/octet-stream"
	HeaderObjectSize = "Jazzmine-Object-Size"
	HeaderNextChunk  = "Jazzmine-Next-Chunk"
)

// ChunkRequest asks for the first chunk of Object stored at or after From, a
// sequence of the bucket's stream: 0 for the first chunk, then the
// HeaderNextChunk of the answer before.
type ChunkRequest struct {
	Object string `json:"object"`
	From   uint64 `json:"from"`
}

// ParseFilesSubject returns the tenant of a chunk request's subject as the
// fleet's account sees it, jazzmine.files.<tenant>. Errors wrap
// [ErrInvalidSubject].
func ParseFilesSubject(subject string) (tenant string, err error) {
	t, err := tokens(subject, SubjectFiles, "tenant")
	return t[0], err
}

// Limits of a job's files and artifacts that [Job.Validate] enforces.
const (
	// MaxInputFiles is the largest number of entries in a job's files.
	MaxInputFiles = 256

	// MaxInlineBytes bounds the inline data of a job's files added up: a
	// file larger than that goes by reference to an object of
	// [FilesBucket]. The job's size is bounded by NATS's max_payload too.
	MaxInlineBytes = 256 << 10

	// MaxPathLength is the longest path of an input file or an artifact,
	// in bytes; one component is at most 255 bytes.
	MaxPathLength = 1024

	// MaxObjectNameLength is the longest object name a file may refer to.
	MaxObjectNameLength = 1024

	// DefaultMaxArtifacts is the number of artifacts (files collected and
	// display images) an execution may leave when the job does not say.
	DefaultMaxArtifacts = 64
	// MaxArtifactsLimit is the largest max_artifacts a job may ask for.
	MaxArtifactsLimit = 1024

	// DefaultMaxArtifactBytes bounds the artifacts of an execution, added up,
	// when the job does not say: 64 MiB.
	DefaultMaxArtifactBytes = 64 << 20
	// MaxArtifactBytesLimit is the largest max_artifact_bytes a job may ask
	// for: 1 GiB.
	MaxArtifactBytesLimit = 1 << 30

	// MaxArtifactPaths is the largest number of entries in a job's
	// artifacts.
	MaxArtifactPaths = 64
)

// OutDir is the directory of the workspace whose files are always
// collected as artifacts.
const OutDir = "out"

// File is an input file of a [Job]: written into the sandbox's workspace
// before the script runs. Exactly one of Data (inline) and Object (a
// reference to an object of [FilesBucket], streamed from there) is set.
type File struct {
	// Path is where the file goes, relative to the workspace ("data/a.csv"):
	// '/'-separated, no "." or ".." components, at most [MaxPathLength]
	// bytes.
	Path string `json:"path" msgpack:"path"`
	// Mode is the file's permission bits, 0 to 0o777; zero means 0o644.
	Mode int `json:"mode,omitempty" msgpack:"mode,omitempty"`
	// Data is the file's content, inline: base64 in JSON, binary in msgpack.
	Data []byte `json:"data,omitempty" msgpack:"data,omitempty"`
	// Object names an object of [FilesBucket] that holds the content; in a
	// tenant's job, of its [TenantFilesBucket] (an artifact of its own) or,
	// with Bucket FilesBucket, of FilesBucket in the tenant's own account (an
	// upload of its own).
	Object string `json:"object,omitempty" msgpack:"object,omitempty"`
	// Bucket is the bucket of Object as the agent's account names it:
	// FilesBucket (what the agent put there) or, in a tenant's job, its
	// TenantFilesBucket; empty means FilesBucket, or in a tenant's job its
	// TenantFilesBucket.
	Bucket string `json:"bucket,omitempty" msgpack:"bucket,omitempty"`
}

// ObjectPrefix is the prefix of the names of the objects that attempt
// attempt of the execution key stores in [FilesBucket]: an artifact at
// workspace path p is ObjectPrefix(key, attempt) + "files/" + p, a display
// image ObjectPrefix(key, attempt) + "display/<n>.png" (two names apart, so
// that no file of the workspace takes an image's name). key is the execution
// id, or "<tenant>.<id>" on a fleet with tenants, so that no execution's
// names are another's.
func ObjectPrefix(key string, attempt int) string {
	return fmt.Sprintf("executions/%s/%d/", key, attempt)
}

// ArtifactObject is the object name of the artifact at workspace path p.
func ArtifactObject(key string, attempt int, p string) string {
	return ObjectPrefix(key, attempt) + "files/" + p
}

// ValidatePath checks a workspace-relative path of an input file or an
// artifact; field names it in the error ("files[0].path").
func ValidatePath(field, p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%s is missing", field)
	case len(p) > MaxPathLength:
		return fmt.Errorf("%s is %d bytes, at most %d are allowed", field, len(p), MaxPathLength)
	case !utf8.ValidString(p) || strings.ContainsRune(p, 0):
		return fmt.Errorf("%s %s is not valid UTF-8 without NUL", field, quote(p))
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("%s %s is absolute: it must be relative to the workspace", field, quote(p))
	case path.Clean(p) != p:
		return fmt.Errorf("%s %s is not a clean path: no \".\", \"..\" or empty components", field, quote(p))
	case p == ".": // the one clean path of a "." component
		return fmt.Errorf("%s %s is the workspace itself, not a file in it", field, quote(p))
	}
	// A clean path keeps ".." only as its leading components.
	for c := range strings.SplitSeq(p, "/") {
		switch {
		case c == "..":
			return fmt.Errorf("%s %s leaves the workspace", field, quote(p))
		case len(c) > 255:
			return fmt.Errorf("%s %s has a component over 255 bytes", field, quote(p))
		}
	}
	return nil
}

// validateFiles checks a job's input files and artifact paths.
func (j *Job) validateFiles() error {
	if len(j.Files) > MaxInputFiles {
		return fmt.Errorf("files holds %d entries, at most %d are allowed", len(j.Files), MaxInputFiles)
	}
	inline := 0
	seen := make(map[string]bool, len(j.Files))
	for i, f := range j.Files {
		field := fmt.Sprintf("files[%d]", i)
		if err := ValidatePath(field+".path", f.Path); err != nil {
			return err
		}
		if seen[f.Path] {
			return fmt.Errorf("%s.path %s is given twice", field, quote(f.Path))
		}
		seen[f.Path] = true
		switch {
		case f.Mode < 0 || f.Mode > 0o777:
			return fmt.Errorf("%s.mode %d is invalid: it must be permission bits, 0 to 0o777 (511)", field, f.Mode)
		case f.Object != "" && f.Data != nil:
			return fmt.Errorf("%s has both data and object: give one", field)
		case f.Object != "" && (len(f.Object) > MaxObjectNameLength || !utf8.ValidString(f.Object)):
			return fmt.Errorf("%s.object %s is invalid: at most %d bytes of UTF-8", field, quote(f.Object), MaxObjectNameLength)
		case f.Bucket != "" && f.Object == "":
			return fmt.Errorf("%s names a bucket and no object", field)
		case f.Bucket != "" && f.Bucket != FilesBucket && !strings.HasPrefix(f.Bucket, FilesBucket+"_") || len(f.Bucket) > 256:
			return fmt.Errorf("%s.bucket %s is invalid: it is %s, or a tenant's %s_<tenant>", field, quote(f.Bucket), FilesBucket, FilesBucket)
		}
		inline += len(f.Data)
	}
	if inline > MaxInlineBytes {
		return fmt.Errorf("the inline data of files is %d bytes, at most %d are allowed: put larger files in the object store bucket %s and give their object names", inline, MaxInlineBytes, FilesBucket)
	}
	if len(j.Artifacts) > MaxArtifactPaths {
		return fmt.Errorf("artifacts holds %d paths, at most %d are allowed", len(j.Artifacts), MaxArtifactPaths)
	}
	for i, p := range j.Artifacts {
		if err := ValidatePath(fmt.Sprintf("artifacts[%d]", i), p); err != nil {
			return err
		}
	}
	if j.MaxArtifacts < 0 || j.MaxArtifacts > MaxArtifactsLimit {
		return fmt.Errorf("max_artifacts %d is invalid: it must be between 0 (the default, %d) and %d", j.MaxArtifacts, DefaultMaxArtifacts, MaxArtifactsLimit)
	}
	if j.MaxArtifactBytes < 0 || j.MaxArtifactBytes > MaxArtifactBytesLimit {
		return fmt.Errorf("max_artifact_bytes %d is invalid: it must be between 0 (the default, %d) and %d", j.MaxArtifactBytes, DefaultMaxArtifactBytes, MaxArtifactBytesLimit)
	}
	return nil
}
