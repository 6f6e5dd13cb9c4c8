//go:build unix

package redisstore

import (
	"io"
	"net"
	"syscall"
)

// pending reports whether bytes wait to be read on conn, without reading
// them or waiting; io.EOF when the server closed it.
func pending(conn net.Conn) (bool, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false, errNoPeek
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false, errNoPeek
	}
	var n int
	var rerr error
	if err := raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, rerr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	}); err != nil {
		return false, err
	}
	switch {
	case n > 0:
		return true, nil
	case rerr == nil:
		return false, io.EOF
	case rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK || rerr == syscall.EINTR:
		return false, nil
	}
	return false, rerr
}
