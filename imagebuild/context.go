package imagebuild

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/jazzmine/worker/harness"
)

// contextTime is the modification time of every file of a build context, so that
// the same spec gives the same bytes.
var contextTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// buildContext returns the build context of spec as a tar archive in memory:
//
//	Dockerfile                                    with the checksum label
//	rootfs/opt/jazzmine/jazzmine_harness/*.py    0444, directories 0555
//	rootfs/tools/*.py                             0444, directory 0555
//	install/requirements.txt                      only with requirements
//	install/wheelhouse/*                          only with requirements and a wheelhouse
//
// COPY keeps these modes and makes root the owner. A wheelhouse file whose
// content no longer has the hash the config was loaded with is an error: the
// checksum would not describe the image.
func buildContext(spec *Spec, checksum string) ([]byte, error) {
	files, err := embeddedHarness()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	cw := &contextWriter{tw: tar.NewWriter(&buf)}
	cw.file("Dockerfile", 0o644, []byte(dockerfile(spec, checksum)))
	cw.dir("rootfs"+path.Dir(HarnessDir), 0o755)
	cw.dir("rootfs"+HarnessDir, 0o555)
	for _, f := range files {
		if f.dir {
			cw.dir("rootfs"+HarnessDir+"/"+f.name, 0o555)
		} else {
			cw.file("rootfs"+HarnessDir+"/"+f.name, 0o444, f.content)
		}
	}
	cw.dir("rootfs"+ToolsDir, 0o555)
	for _, t := range spec.Tools {
		cw.file("rootfs"+ToolsDir+"/"+t.Name, 0o444, t.Content)
	}
	if len(spec.Requirements) > 0 {
		cw.dir("install", 0o755)
		cw.file("install/requirements.txt", 0o644, []byte(strings.Join(spec.Requirements, "\n")+"\n"))
		if spec.Wheelhouse != "" {
			cw.dir("install/wheelhouse", 0o755)
			for _, w := range contextWheels(spec) {
				cw.wheel("install/wheelhouse/"+w.Name, w)
			}
		}
	}
	if cw.err != nil {
		return nil, cw.err
	}
	if err := cw.tw.Close(); err != nil {
		return nil, fmt.Errorf("build context: %w", err)
	}
	return buf.Bytes(), nil
}

// harnessEntry is a directory or a file of the harness's source (harness.Source):
// its path there, which is its path under HarnessDir in the image.
type harnessEntry struct {
	name    string
	dir     bool
	content []byte
}

// embeddedHarness returns the entries of the embedded harness, read once.
var embeddedHarness = sync.OnceValues(func() ([]harnessEntry, error) {
	return readHarness(harness.Source())
})

// readHarness returns every directory and file of src but its root, in lexical
// order.
func readHarness(src fs.FS) ([]harnessEntry, error) {
	var entries []harnessEntry
	err := fs.WalkDir(src, ".", func(name string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case name == ".":
			return nil
		case d.IsDir():
			entries = append(entries, harnessEntry{name: name, dir: true})
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("%s is not a regular file", name)
		}
		content, err := fs.ReadFile(src, name)
		entries = append(entries, harnessEntry{name: name, content: content})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read the harness's source: %w", err)
	}
	return entries, nil
}

// contextWriter writes a build context's entries; after the first error it
// does nothing and keeps that error.
type contextWriter struct {
	tw  *tar.Writer
	err error
}

func (c *contextWriter) header(name string, mode, size int64, typ byte) bool {
	if c.err != nil {
		return false
	}
	h := &tar.Header{Name: name, Mode: mode, Size: size, ModTime: contextTime, Typeflag: typ}
	if err := c.tw.WriteHeader(h); err != nil {
		c.err = fmt.Errorf("build context: %s: %w", name, err)
		return false
	}
	return true
}

func (c *contextWriter) dir(name string, mode int64) {
	c.header(name+"/", mode, 0, tar.TypeDir)
}

func (c *contextWriter) file(name string, mode int64, content []byte) {
	if !c.header(name, mode, int64(len(content)), tar.TypeReg) {
		return
	}
	if _, err := c.tw.Write(content); err != nil {
		c.err = fmt.Errorf("build context: %s: %w", name, err)
	}
}

// wheel copies a wheelhouse file into the archive and checks its hash.
func (c *contextWriter) wheel(name string, w WheelFile) {
	if c.err != nil {
		return
	}
	f, err := os.Open(w.Path)
	if err != nil {
		c.err = fmt.Errorf("wheelhouse: %w", err)
		return
	}
	defer f.Close()
	if !c.header(name, 0o644, w.Size, tar.TypeReg) {
		return
	}
	h := sha256.New()
	n, err := io.Copy(c.tw, io.TeeReader(io.LimitReader(f, w.Size), h))
	if err != nil {
		c.err = fmt.Errorf("build context: %s: %w", name, err)
		return
	}
	if extra, _ := f.Read(make([]byte, 1)); n != w.Size || extra != 0 || hex.EncodeToString(h.Sum(nil)) != w.SHA256 {
		c.err = fmt.Errorf("wheelhouse: %s changed since the config was loaded; load it again", w.Path)
	}
}
