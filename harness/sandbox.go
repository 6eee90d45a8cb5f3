package harness

// What a sandbox's image (imagebuild) and its containers (sandboxpool) must agree
// on, defined once here, the one package both import.
const (
	// SandboxUser is the image's non-root user and group, and SandboxUID their
	// id. Every container's processes run with that group, and each container
	// with a uid of its own (sandboxpool.SandboxUIDBase).
	SandboxUser = "sandbox"
	SandboxUID  = 10001
	// LabelManaged is "true" on every image, container, volume and network
	// jazzmine creates: what its reapers and tests look for.
	LabelManaged = "jazzmine.managed"
	// LabelSandbox names the sandbox an image, container or volume is for.
	LabelSandbox = "jazzmine.sandbox"
	// LabelChecksum is a sandbox image's checksum, on the image and on the
	// containers made from it.
	LabelChecksum = "jazzmine.checksum"
)
