// Package simulate replays a trace of requests under proposed limits, as
// `sluice simulate` does, so that a limit can be tried on recorded or
// generated traffic before it is deployed.
//
// A trace is a list of requests, each an offset from the start of the
// trace, a key and a cost (ReadTrace reads the text form, WriteTrace
// writes it, Generate makes one from traffic shapes). A Decider decides
// the requests one at a time: Bucket with the exact token-bucket
// arithmetic of package bucket, which every store implements, and
// FixedWindow with the fixed-window counter of envoyproxy/ratelimit, for
// users moving from it. Nothing waits and nothing is stored: the trace's
// offsets are the clock. Replay runs a trace through a Decider and tallies
// the decisions per key; a Report writes one or two runs of the same trace
// as text or JSON, and LevelChart and DenyRateChart draw them as SVG.
package simulate
