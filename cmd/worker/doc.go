// Command worker is the one binary of jazzmine worker: serve, submit, proxy,
// build and version subcommands.
package main
