// Package dashboards holds the Grafana dashboard of the Prometheus collector,
// ratewindow.json, and the tests that check it: its structure, that it shows
// every metric the collector exports, and every panel's query evaluated by a
// real Prometheus scraping a server under a known load.
//
// It is a module of its own, so that no other module depends on what its tests
// use. See docs/observability.md for how to import the dashboard.
package dashboards
