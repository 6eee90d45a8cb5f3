package harness

import (
	"embed"
	"io/fs"
)

// Package is the name of the harness's Python package, the process that runs inside
// every sandbox container: a directory of modules, one concern each (its
// __init__.py lists them).
const Package = "jazzmine_harness"

//go:embed jazzmine_harness/*.py
var source embed.FS

// Source returns the harness's source: the directory [Package] and its *.py files,
// no others. Image builds copy it into the image, read-only; StartProcess copies it
// into a directory of its own and runs it under a local python3. Command starts it
// from the directory that holds it.
func Source() fs.FS { return source }

// Command returns the command line that runs the harness under python from dir, the
// directory that holds [Package] (in an image, /opt/jazzmine). The harness is
// imported rather than run as a file, so that Python loads bytecode compiled ahead
// (an image compiles it at build) instead of compiling the source at every start.
// -P keeps the working directory, where scripts write, off the harness's import
// path; dir is put first on it, as `python3 file.py` would put the file's own. -B
// writes no bytecode (an image has it; a local run compiles the source, as a file
// run would). -u leaves Python's own streams unbuffered.
func Command(python, dir string) []string {
	return []string{python, "-u", "-B", "-P", "-c",
		"import sys; sys.path.insert(0, sys.argv.pop(1)); import " + Package + "; " + Package + ".main()", dir}
}
