// Package proxy owns the egress proxy server that runs in the sidecar
// container (`worker proxy`): an HTTP forward proxy that allows only the
// host:port pairs granted to the sandbox whose network a connection came from.
//
// It imports only the standard library.
package proxy
