// Package adaptertest holds the tests that every adapter must pass alike:
// one table of HTTP scenarios run through nethttp, chimw, ginmw and echomw
// on a real Redis and a real Redis Cluster, and their overhead benchmarks.
// It is a module of its own, so that the main module does not require
// chi, gin and echo; it has no code but its tests.
package adaptertest
