// Command worker is the one binary of jazzmine worker: serve, submit, mcp, build,
// proxy, nats-auth, nkey and version subcommands.
package main
