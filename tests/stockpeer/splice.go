// SPDX-License-Identifier: Apache-2.0
// splice(2) between two stream sockets through a pipe, as Go's internal/poll.Splice does since
// Go 1.21 (1 MiB pipe, at most 1 MiB per drain, SPLICE_F_NONBLOCK, waits in the runtime's
// poller). Go 1.19's net package splices only unix->TCP, with a 64 KiB pipe; KubeVirt builds
// with Go 1.26, whose io.Copy splices both ways in plain text, so the bench's stock peer should.

package main

import (
	"io"
	"os"
	"sync/atomic"
	"syscall"
)

const (
	maxSpliceSize  = 1 << 20
	spliceNonblock = 0x2   // SPLICE_F_NONBLOCK
	fSetPipeSz     = 0x407 // F_SETPIPE_SZ (F_LINUX_SPECIFIC_BASE + 7)
)

// spliceConns moves src's bytes to dst until src's EOF (nil error) or an error; the bytes
// written to dst (also added to count as they go).
func spliceConns(dst, src syscall.Conn, count *atomic.Int64) (int64, error) {
	rc, err := src.SyscallConn()
	if err != nil {
		return 0, err
	}
	wc, err := dst.SyscallConn()
	if err != nil {
		return 0, err
	}
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		return 0, os.NewSyscallError("pipe2", err)
	}
	defer syscall.Close(fds[0])
	defer syscall.Close(fds[1])
	// A smaller pipe works too, with more system calls (Go ignores the error as well).
	_, _, _ = syscall.Syscall(syscall.SYS_FCNTL, uintptr(fds[0]), fSetPipeSz, maxSpliceSize)

	var written int64
	for {
		var n int64
		var serr error
		err := rc.Read(func(fd uintptr) bool {
			for {
				n, serr = syscall.Splice(int(fd), nil, fds[1], nil, maxSpliceSize, spliceNonblock)
				if serr != syscall.EINTR {
					return serr != syscall.EAGAIN
				}
			}
		})
		if err != nil {
			return written, err
		}
		if serr != nil {
			return written, os.NewSyscallError("splice", serr)
		}
		if n == 0 {
			return written, nil // src at EOF
		}
		inPipe := n
		var werr error
		err = wc.Write(func(fd uintptr) bool {
			for inPipe > 0 {
				m, e := syscall.Splice(fds[0], nil, int(fd), nil, int(inPipe), spliceNonblock)
				switch {
				case e == syscall.EINTR:
					continue
				case m > 0:
					inPipe -= m
					written += m
					count.Add(m)
					continue
				case e == syscall.EAGAIN:
					return false
				case e == nil:
					e = io.ErrShortWrite // cannot happen: we own the pipe's write side
				}
				werr = e
				return true
			}
			return true
		})
		if err != nil {
			return written, err
		}
		if werr != nil {
			return written, os.NewSyscallError("splice", werr)
		}
	}
}
