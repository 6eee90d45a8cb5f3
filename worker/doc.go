// Package worker is the queue side of the product, on NATS JetStream: it takes the
// jobs agents publish, runs each in a container of the pool, and publishes what the
// script did as the execution's events.
//
// A [Worker] is assembled by [New] from a [Config] (the NATS connection, the pool, the
// sandboxes it serves) and run by [Worker.Start] and [Worker.Shutdown]. Its parts,
// each a type and a file of its own (docs/ARCHITECTURE.md lists them):
//
//   - streams and buckets every worker converges on (topology.go), and per sandbox a
//     consumer whose pull loops take a free container slot before they ask for one
//     job (producer.go); a pending sandbox's loops wait for [Worker.Serve], its image
//     being built, or its [Worker.Unavailable] is put in the catalog (pending.go);
//   - the processor (job.go, decode.go, outcome.go): one delivery from its decoding to
//     its ack, nak or term, and exactly one script_done per execution, whatever the
//     redeliveries;
//   - the events publisher (events.go): an attempt's events, cut to the server's
//     payload, sent again in order until the stream has stored them all;
//   - cancels (cancel.go), arbitrated across the fleet in a bucket, whether the job is
//     queued or running (running.go);
//   - sessions (session.go, opener.go, rescuer.go): calls that run one at a time in
//     one process, each routed once to the worker that holds their container, and
//     their ends, those of dead owners by the rescuer;
//   - files (files.go): input files into the workspace, artifacts and
//     display images out to the object store, a tenant's in a bucket of its own;
//   - tenants (tenant.go): their subjects, keys, shares of the backlog and of the
//     background work (background.go);
//   - the sandbox catalog (catalog.go): what each sandbox offers, asked of the workers
//     by agents of the fleet and of tenants alike;
//   - the served subjects (served.go): the streams take the jobs and calls of the
//     sandboxes the fleet serves, and the server refuses the others at publish;
//   - liveness (liveness.go): the fleet's view of its workers, for the pool's reaper;
//   - telemetry (telemetry.go): spans and instruments.
//
// It does not own containers (package sandboxpool), images (imagebuild), the
// harness's protocol (harness), the wire formats (wire), nor the process around it:
// the embedded NATS server, telemetry setup and health endpoints are cmd/worker's.
package worker
