package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// commandTimeout bounds one command sent by [command].
const commandTimeout = time.Second

// command sends one command to addr; see [commandWithin].
func command(addr string, args ...string) (any, error) {
	return commandWithin(commandTimeout, addr, args...)
}

// commandWithin sends one command to addr on a new connection, taking at most
// timeout, and returns the reply:
// a string (simple or bulk), an int64, nil, or a []any of those. An error reply is
// returned as a *replyError.
//
// It speaks plain RESP2 without a client library, so that readiness checks are
// one dial and one round trip, with no handshake, pool or reconnect back-off.
func commandWithin(timeout time.Duration, addr string, args ...string) (any, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return nil, err
	}
	return readReply(bufio.NewReader(conn))
}

// replyError is an error reply of the server.
type replyError struct{ msg string }

func (e *replyError) Error() string { return e.msg }

// readReply reads one RESP2 reply.
func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply line")
	}
	switch kind, rest := line[0], line[1:]; kind {
	case '+':
		return rest, nil
	case '-':
		return nil, &replyError{rest}
	case ':':
		return strconv.ParseInt(rest, 10, 64)
	case '$':
		n, err := strconv.Atoi(rest)
		if err != nil || n < 0 {
			return nil, err // $-1: nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(rest)
		if err != nil || n < 0 {
			return nil, err // *-1: nil
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return out, nil
	default:
		return nil, fmt.Errorf("unexpected reply %q", line)
	}
}

// commandString sends one command and returns its reply as a string.
func commandString(addr string, args ...string) (string, error) {
	v, err := command(addr, args...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: unexpected reply %v", strings.Join(args, " "), v)
	}
	return s, nil
}
