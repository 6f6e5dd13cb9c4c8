package core

import (
	"bufio"
	"io"
	"net"
	"net/http"
)

// statusWriter records the status of a response, for Rule.CountIf and
// whether OnError answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

// ok records 200 unless a status was written, as net/http sends.
func (w *statusWriter) ok() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
}

// WriteHeader records the first final status (1xx but 101 are interim).
func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) { w.ok(); return w.ResponseWriter.Write(b) }

// ReadFrom copies src to the response: io.Copy uses the wrapped writer's
// ReadFrom if any (sendfile), or src's WriteTo, which reaches it for a file.
func (w *statusWriter) ReadFrom(src io.Reader) (int64, error) {
	w.ok()
	return io.Copy(w.ResponseWriter, src)
}

func (w *statusWriter) Flush() { _ = w.FlushError() } // http.Flusher

// FlushError is Flush with its error, for http.ResponseController.
func (w *statusWriter) FlushError() error {
	w.ok()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hands the connection over (http.Hijacker): 101 unless a status was written.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return c, rw, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter } // for http.ResponseController

// WatchStatus returns w wrapped to record the status of its response as
// net/http sends it (the first final status, 1xx but 101 being interim;
// 200 when the body or a flush goes first; 101 for a hijack before any
// status), and a function that returns it (0: none yet), for an adapter
// that settles Rule.CountIf itself (Enforcer.SettleAfter). Flusher,
// Hijacker and io.ReaderFrom still work, and http.ResponseController
// reaches w.
func WatchStatus(w http.ResponseWriter) (http.ResponseWriter, func() int) {
	sw := &statusWriter{ResponseWriter: w}
	return sw, func() int { return sw.status }
}
