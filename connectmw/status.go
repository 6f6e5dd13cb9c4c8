package connectmw

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"

	"connectrpc.com/connect"
)

// callWriter watches the response of a Connect, gRPC or gRPC-Web call for
// Rule.CountIf: the HTTP status written, and for the protocols whose code
// travels after the messages, the frame that carries it (gRPC-Web's
// trailers, Connect streaming's end of stream), kept up to maxEndFrame
// bytes.
type callWriter struct {
	http.ResponseWriter
	status int
	hdr    [5]byte // the frame header being read: flags, then the length
	hdrN   int
	left   uint32 // payload bytes of the current frame still to come
	end    bool   // the current frame is the one that carries the code
	last   []byte // that frame's payload
	flags  byte   // its flags
}

// maxEndFrame bounds the end-of-stream frame kept: its code comes first.
const maxEndFrame = 8 << 10

// Envelope flags: compressed; Connect's end of stream; gRPC-Web's trailers.
const (
	flagCompressed = 0b0000_0001
	flagEndStream  = 0b0000_0010
	flagTrailer    = 0b1000_0000
)

func (w *callWriter) WriteHeader(code int) {
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *callWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.frames(b)
	return w.ResponseWriter.Write(b)
}

// frames reads the envelopes of a streamed body as b goes out.
func (w *callWriter) frames(b []byte) {
	for len(b) > 0 {
		if w.hdrN < len(w.hdr) {
			n := copy(w.hdr[w.hdrN:], b)
			w.hdrN += n
			b = b[n:]
			if w.hdrN < len(w.hdr) {
				return
			}
			w.left = binary.BigEndian.Uint32(w.hdr[1:])
			w.end = w.hdr[0]&(flagEndStream|flagTrailer) != 0
			if w.end {
				w.flags, w.last = w.hdr[0], w.last[:0]
			}
		}
		n := min(uint32(len(b)), w.left)
		if w.end && len(w.last) < maxEndFrame {
			w.last = append(w.last, b[:min(int(n), maxEndFrame-len(w.last))]...)
		}
		w.left -= n
		b = b[n:]
		if w.left == 0 {
			w.hdrN = 0
		}
	}
}

func (w *callWriter) Flush() { _ = w.FlushError() } // http.Flusher

// FlushError is Flush with its error, for http.ResponseController.
func (w *callWriter) FlushError() error {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hands the connection over (http.Hijacker).
func (w *callWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// Unwrap returns the ResponseWriter, for http.ResponseController.
func (w *callWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// httpStatus is the status Rule.CountIf sees for the call: the HTTP status
// its code maps to under the Connect protocol (connect-go's mapping:
// Unauthenticated 401, ResourceExhausted 429, ...), whatever protocol the
// client spoke; 200 for a call that succeeded. The code is read from the
// grpc-status trailer (gRPC, gRPC-Web) or the Connect error (the HTTP
// status of a unary call, the end of stream of a stream); a code that
// cannot be read counts as Unknown (500).
func (w *callWriter) httpStatus() int {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	h := w.Header()
	ct := h.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "application/grpc-web"):
		if v := grpcStatus(h); v != "" { // trailers-only
			return fromGRPC(v)
		}
		body, ok := w.endFrame(flagTrailer, h.Get("Grpc-Encoding"))
		if !ok {
			return http.StatusInternalServerError
		}
		return fromGRPC(grpcStatus(readTrailer(body)))
	case strings.HasPrefix(ct, "application/grpc"):
		return fromGRPC(grpcStatus(h))
	case strings.HasPrefix(ct, "application/connect+"):
		body, ok := w.endFrame(flagEndStream, h.Get("Connect-Content-Encoding"))
		if !ok {
			return http.StatusInternalServerError
		}
		var end struct {
			Error *struct {
				Code connect.Code `json:"code"`
			} `json:"error"`
		}
		switch err := json.NewDecoder(bytes.NewReader(body)).Decode(&end); {
		case err != nil:
			return http.StatusInternalServerError
		case end.Error == nil:
			return http.StatusOK
		}
		return connectHTTPStatus(end.Error.Code)
	}
	return w.status // Connect unary: the status is the code's
}

// endFrame returns the payload of the last frame with flag, decompressed
// (gzip, the one encoding every connect-go peer has), or false.
func (w *callWriter) endFrame(flag byte, encoding string) ([]byte, bool) {
	if w.flags&flag == 0 {
		return nil, false
	}
	if w.flags&flagCompressed == 0 {
		return w.last, true
	}
	if encoding != "gzip" {
		return nil, false
	}
	zr, err := gzip.NewReader(bytes.NewReader(w.last))
	if err != nil {
		return nil, false
	}
	b, err := io.ReadAll(io.LimitReader(zr, maxEndFrame))
	return b, err == nil || len(b) > 0
}

// grpcStatus returns the grpc-status field of h, as a header or, with
// net/http's trailer prefix, a trailer; "" when none.
func grpcStatus(h http.Header) string {
	for k, v := range h {
		if k = strings.TrimPrefix(k, http.TrailerPrefix); strings.EqualFold(k, "grpc-status") && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// readTrailer reads gRPC-Web's trailer block ("grpc-status: 16\r\n...").
func readTrailer(b []byte) http.Header {
	h := http.Header{}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimRight(line, "\r"), ":")
		if ok {
			h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
		}
	}
	return h
}

// fromGRPC maps a grpc-status value to the Connect protocol's HTTP status.
func fromGRPC(v string) int {
	n, err := strconv.ParseUint(v, 10, 32)
	switch {
	case err != nil:
		return http.StatusInternalServerError
	case n == 0:
		return http.StatusOK
	}
	return connectHTTPStatus(connect.Code(n))
}

// connectHTTPStatus is connect-go's own mapping of a code to the HTTP
// status of a Connect unary error (connectCodeToHTTP, unexported there).
func connectHTTPStatus(code connect.Code) int {
	switch code {
	case connect.CodeCanceled:
		return 499
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists, connect.CodeAborted:
		return http.StatusConflict
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnimplemented:
		return http.StatusNotImplemented
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError // Unknown, Internal, DataLoss and any other
}
