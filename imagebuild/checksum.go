package imagebuild

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"sort"
	"strings"
)

// checksumVersion changes whenever the checksum's inputs change meaning, so that
// every image is rebuilt once.
const checksumVersion = "jazzmine-imagebuild-checksum-3"

// Checksum returns the hex sha256 that identifies spec's image built on the base
// image with id baseImageID. It covers, each length-prefixed so that no two
// different inputs run together: the base image's id, the generated Dockerfile,
// every directory and file of the harness (harness.Source: path, and content, by
// path), every tool file (name and content, by name), the requirements, and, when
// there are requirements, the wheelhouse's files (name and content hash, by name).
// Environment, secrets, resources, network, mounts and pool settings are applied
// when a container starts and are not covered. It panics if the embedded harness
// cannot be read, which only a broken build makes happen.
func Checksum(spec *Spec, baseImageID string) string {
	files, err := embeddedHarness()
	if err != nil {
		panic("imagebuild: " + err.Error())
	}
	return checksum(spec, baseImageID, files)
}

func checksum(spec *Spec, baseImageID string, harnessFiles []harnessEntry) string {
	h := sha256.New()
	field(h, "version", []byte(checksumVersion))
	field(h, "base", []byte(baseImageID))
	field(h, "dockerfile", []byte(Dockerfile(spec)))
	count(h, "harness", len(harnessFiles))
	for _, f := range harnessFiles {
		field(h, "harness entry", []byte(f.name))
		if f.dir {
			field(h, "directory", nil)
		} else {
			field(h, "content", f.content)
		}
	}

	tools := append([]ToolFile(nil), spec.Tools...)
	sort.Slice(tools, func(i, j int) bool { return tools[i].Name < tools[j].Name })
	count(h, "tools", len(tools))
	for _, t := range tools {
		field(h, "tool", []byte(t.Name))
		field(h, "content", t.Content)
	}

	count(h, "apt packages", len(spec.AptPackages))
	for _, p := range spec.AptPackages {
		field(h, "apt package", []byte(p))
	}

	count(h, "requirements", len(spec.Requirements))
	for _, r := range spec.Requirements {
		field(h, "requirement", []byte(r))
	}

	wheels := contextWheels(spec)
	count(h, "wheels", len(wheels))
	for _, w := range wheels {
		field(h, "wheel", []byte(w.Name))
		field(h, "sha256", []byte(w.SHA256))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// contextWheels returns the wheelhouse files the build context holds: all of
// them, sorted by name, when the sandbox has requirements and a wheelhouse.
func contextWheels(spec *Spec) []WheelFile {
	if len(spec.Requirements) == 0 || spec.Wheelhouse == "" {
		return nil
	}
	wheels := append([]WheelFile(nil), spec.Wheels...)
	sort.Slice(wheels, func(i, j int) bool { return wheels[i].Name < wheels[j].Name })
	return wheels
}

// field writes a name and a value to h, each prefixed with its length.
func field(h hash.Hash, name string, value []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(name)))
	h.Write(n[:])
	h.Write([]byte(name))
	binary.BigEndian.PutUint64(n[:], uint64(len(value)))
	h.Write(n[:])
	h.Write(value)
}

func count(h hash.Hash, name string, n int) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	field(h, name, b[:])
}

// Tag returns the image tag of a sandbox's image:
// jazzmine-sandbox-<name>:<the first 16 hex characters of the checksum>. Docker
// wants repository names in lower case, without a trailing or doubled separator,
// so the name is lowered and every character but a-z and 0-9 becomes "-" (the
// checksum, which covers the name, keeps two sandboxes apart).
func Tag(name, checksum string) string {
	if len(checksum) > 16 {
		checksum = checksum[:16]
	}
	return repository(name) + ":" + checksum
}

// repository returns the image repository of a sandbox.
func repository(name string) string {
	b := []byte(strings.ToLower(name))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			b[i] = '-'
		}
	}
	s := strings.TrimRight(string(b), "-")
	if s == "" {
		s = "unnamed"
	}
	return "jazzmine-sandbox-" + s
}
