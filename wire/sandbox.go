package wire

import "time"

// SandboxesBucket is the key-value bucket of the fleet's sandbox catalog: one
// key per sandbox some worker serves, its value a [SandboxInfo] in JSON. Each
// worker puts the entries of its sandboxes once their first container is ready,
// again when what they loaded changes, and every quarter of the bucket's TTL
// (an hour), so that the entry of a sandbox no worker serves any more expires.
const SandboxesBucket = "jazzmine_sandboxes"

// SubjectSandboxes is where an agent of a tenant asks for the catalog, whose
// bucket its account does not reach: jazzmine.sandboxes.<tenant> in the
// fleet's account. A worker answers with the catalog's entries, a JSON array
// of [SandboxInfo] sorted by name (Content-Type [ContentTypeJSON]), or, with
// no body, [HeaderError]; beyond the tenant's rate the error is [Busy].
const SubjectSandboxes = "jazzmine.sandboxes"

// HeaderError carries why a worker could not answer a tenant's request, and
// Busy is its value for a request beyond the tenant's rate: ask again later.
const (
	HeaderError = "Jazzmine-Error"
	Busy        = "busy: too many requests of this tenant; ask again later"
)

// ParseSandboxesSubject returns the tenant of a catalog request's subject as
// the fleet's account sees it, jazzmine.sandboxes.<tenant>. Errors wrap
// [ErrInvalidSubject].
func ParseSandboxesSubject(subject string) (tenant string, err error) {
	t, err := tokens(subject, SubjectSandboxes, "tenant")
	return t[0], err
}

// SandboxInfo is a sandbox as the catalog describes it to agents: what a
// script may call there and under which limits. The fields are JSON snake_case.
type SandboxInfo struct {
	// Sandbox is the sandbox's name.
	Sandbox string `json:"sandbox"`
	// Description is what the sandbox's configuration says of it; may be empty.
	Description string `json:"description,omitempty"`
	// Tools are the functions every script of the sandbox finds as globals,
	// sorted by name.
	Tools []ToolSpec `json:"tools"`
	// ToolErrors name the tool files (and preloaded modules) that failed to
	// load, each "file: error".
	ToolErrors []string `json:"tool_errors,omitempty"`
	// Python is the sandbox's Python version, e.g. "3.11.2".
	Python string `json:"python,omitempty"`
	// AptPackages are the Debian packages its image installed (the config's
	// apt_packages, sorted), e.g. "python3-yaml", which scripts import as yaml.
	AptPackages []string `json:"apt_packages,omitempty"`
	// Packages are the pip requirements its image installed (the config's
	// requirements). The base image's own packages are listed in neither.
	Packages []string `json:"packages,omitempty"`
	// TimeoutSec is the timeout of a job that sets none; a job may ask for up
	// to [MaxTimeoutSec].
	TimeoutSec float64 `json:"timeout_sec"`
	// MemoryMB, CPUs and WorkspaceMB are each container's limits.
	MemoryMB    int64   `json:"memory_mb,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
	WorkspaceMB int64   `json:"workspace_mb,omitempty"`
	// AllowedHosts are the host:port entries its scripts may reach through the
	// egress proxy; empty means no network at all.
	AllowedHosts []string `json:"allowed_hosts,omitempty"`
	// FleetOnly says that the sandbox serves the fleet's own account only: its
	// workers refuse it to tenants (a fleet that runs its tenants' scripts under
	// gVisor only, and this sandbox under another runtime). A tenant's catalog
	// answer leaves it out.
	FleetOnly bool `json:"fleet_only,omitempty"`
	// Building says that the worker that wrote the entry is building the
	// sandbox's image: a job of it waits in the stream until a worker serves it
	// (seconds to minutes); its tools are listed then.
	Building bool `json:"building,omitempty"`
	// Error, when set, says why the worker that wrote the entry cannot serve the
	// sandbox (its image could not be built, or its base image is missing), and
	// that no worker serves it: a worker that serves it replaces the entry.
	Error string `json:"error,omitempty"`
	// WorkerID is the worker that wrote the entry, and Updated when.
	WorkerID string    `json:"worker_id"`
	Updated  time.Time `json:"updated"`
}

// ToolSpec is one tool of a sandbox: a function of its tool files.
type ToolSpec struct {
	// Name is the name scripts call it by.
	Name string `json:"name"`
	// Signature is its signature as Python's inspect.signature writes it,
	// e.g. "(text: str, n: int = 3) -> list[str]"; "(...)" when unknown.
	Signature string `json:"signature"`
	// Doc is its docstring, cleaned as inspect.cleandoc does; may be empty.
	Doc string `json:"doc,omitempty"`
	// Async reports an async def, which scripts call as a plain function.
	Async bool `json:"async,omitempty"`
}
