// SPDX-License-Identifier: Apache-2.0
// The manager against real vmigd daemons on loopback: two daemons stand for two nodes, each with
// its own manager as each node's virt-handler has. Plain text (vmigd --no-tls) and TLS with
// KubeVirt's certificate names. The vmigd binary: $VMIGD, else ../../../build/vmigd; the test
// skips, saying so, when there is none.

package vmigdproxy

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"vmigd/contrib/kubevirt/internal/testpki"
)

func vmigdBinary(t *testing.T) string {
	p := os.Getenv("VMIGD")
	if p == "" {
		p = "../../../build/vmigd"
	}
	abs, err := filepath.Abs(p)
	if err == nil {
		_, err = os.Stat(abs)
	}
	if err != nil {
		t.Skipf("no vmigd binary (%v): set VMIGD, or build one (meson setup build && ninja -C build)", err)
	}
	return abs
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// realVmigd is one vmigd process; start again after it ended is a restart on the same socket.
type realVmigd struct {
	t       *testing.T
	name    string
	bin     string
	control string
	args    []string
	log     *lockedBuffer
	cmd     *exec.Cmd
	exited  chan struct{}
}

// vmigd's start line names its node listener: "started: listen=127.0.0.1:PORT".
var startedListenRE = regexp.MustCompile(`started: listen=(\S+)`)

func newRealVmigd(t *testing.T, name, bin, dir string, args []string) *realVmigd {
	d := &realVmigd{t: t, name: name, bin: bin, control: filepath.Join(dir, name+".sock"),
		args: args, log: &lockedBuffer{}}
	d.start()
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			t.Logf("vmigd %s log:\n%s", d.name, d.log.String())
		}
	})
	return d
}

func (d *realVmigd) start() {
	d.t.Helper()
	fmt.Fprintf(d.log, "---- start ----\n")
	d.cmd = exec.Command(d.bin, append([]string{"--control", d.control}, d.args...)...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		cmd.Wait()
		close(exited)
	}(d.cmd, d.exited)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := rawCall(d.control, map[string]interface{}{"op": "status"}); err == nil {
			d.keepListenAddress()
			return
		}
		select {
		case <-d.exited:
			d.t.Fatalf("vmigd %s exited at start:\n%s", d.name, d.log.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("vmigd %s does not answer on %s:\n%s", d.name, d.control, d.log.String())
		}
	}
}

// keepListenAddress makes later starts bind the node listener the first start got, as a
// deployment with a configured port does: a restart asked for port 0 again could be given,
// by chance, a port just freed that a target had published, and the test would then see the
// fallback to new ports where it checks that they were kept.
func (d *realVmigd) keepListenAddress() {
	m := startedListenRE.FindStringSubmatch(d.log.String())
	if m == nil {
		return
	}
	for i := 0; i+1 < len(d.args); i++ {
		if d.args[i] == "--listen" && strings.HasSuffix(d.args[i+1], ":0") {
			d.args = append(append([]string{}, d.args...)[:i+1], append([]string{m[1]}, d.args[i+2:]...)...)
			return
		}
	}
}

func (d *realVmigd) signal(sig syscall.Signal, wait time.Duration) bool {
	if d.cmd == nil || d.cmd.Process == nil {
		return true
	}
	select {
	case <-d.exited:
		return true
	default:
	}
	d.cmd.Process.Signal(sig)
	select {
	case <-d.exited:
		return true
	case <-time.After(wait):
		return false
	}
}

func (d *realVmigd) kill() { d.signal(syscall.SIGKILL, 10*time.Second) }

// takeover starts a vmigd --takeover on d's socket and waits until status answers with its pid;
// d is then the new one. The old one's exit closes the channel returned (killed at cleanup).
func (d *realVmigd) takeover() (oldPid int, oldExited chan struct{}) {
	d.t.Helper()
	oldCmd, oldExited := d.cmd, d.exited
	d.t.Cleanup(func() {
		oldCmd.Process.Kill()
		<-oldExited
	})
	fmt.Fprintf(d.log, "---- takeover ----\n")
	cmd := exec.Command(d.bin, append(append([]string{"--control", d.control}, d.args...), "--takeover")...)
	cmd.Stdout, cmd.Stderr = d.log, d.log
	if err := cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	d.cmd, d.exited = cmd, exited
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := rawCall(d.control, map[string]interface{}{"op": "status"})
		if err == nil {
			if st, _ := r["status"].(map[string]interface{}); st != nil && st["pid"] == float64(cmd.Process.Pid) {
				return oldCmd.Process.Pid, oldExited
			}
		}
		select {
		case <-exited:
			d.t.Fatalf("vmigd %s --takeover exited:\n%s", d.name, d.log.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("vmigd %s --takeover did not take over:\n%s", d.name, d.log.String())
		}
	}
}

func (d *realVmigd) pid() int { return d.cmd.Process.Pid }

func rawCall(path string, req map[string]interface{}) (map[string]interface{}, error) {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return nil, err
	}
	var r map[string]interface{}
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, err
	}
	if r["ok"] != true {
		return r, fmt.Errorf("%v (%v)", r["error"], r["code"])
	}
	return r, nil
}

// echoServer stands for what a target virt-launcher serves: QEMU's incoming socket, virtqemud,
// the NBD server. It echoes; with a greeting it speaks first, as NBD's server does.
type echoServer struct {
	ln       net.Listener
	greeting []byte
	received int64
	conns    int32
	wg       sync.WaitGroup
}

func newEchoServer(t *testing.T, path, greeting string) *echoServer {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln, greeting: []byte(greeting)}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			atomic.AddInt32(&e.conns, 1)
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer c.Close()
				if len(e.greeting) > 0 {
					if _, err := c.Write(e.greeting); err != nil {
						return
					}
				}
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						atomic.AddInt64(&e.received, int64(n))
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); e.wg.Wait() })
	return e
}

// checkEcho sends n random bytes into a source socket and expects them back, through both
// daemons and the echo server.
func checkEcho(t *testing.T, sock string, n int, greeting string) error {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if greeting != "" {
		// nothing written yet: the target must have opened the local socket on accept
		g := make([]byte, len(greeting))
		if _, err := io.ReadFull(c, g); err != nil {
			return fmt.Errorf("greeting: %w", err)
		}
		if string(g) != greeting {
			return fmt.Errorf("greeting %q, want %q", g, greeting)
		}
	}
	data := make([]byte, n)
	rand.Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		werr <- err
	}()
	back := make([]byte, n)
	if _, err := io.ReadFull(c, back); err != nil {
		return fmt.Errorf("reading back: %w", err)
	}
	if err := <-werr; err != nil {
		return err
	}
	if !bytes.Equal(back, data) {
		return errors.New("bytes came back changed")
	}
	return nil
}

// launcherDirs makes the directories a target virt-launcher has (vmigd checks them at start).
func launcherDirs(t *testing.T, files []string) []string {
	for _, f := range files {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tcpListening(port string) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func TestRealVmigdPlain(t *testing.T) { realScenario(t, false) }

func TestRealVmigdTLS(t *testing.T) { realScenario(t, true) }

func realScenario(t *testing.T, withTLS bool) {
	bin := vmigdBinary(t)
	// short paths: a KubeVirt socket path must stay under sun_path's 108 bytes
	dir, err := os.MkdirTemp("", "vk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	help, _ := exec.Command(bin, "--help").CombinedOutput()
	args := []string{"--listen", "127.0.0.1:0", "--advertise", "127.0.0.1", "--drain-timeout", "5",
		"--log-level", "debug"}
	if bytes.Contains(help, []byte("--socket-owner")) {
		args = append(args, "--socket-owner", fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid()))
	}
	disable := !withTLS
	var c testpki.Certs
	if withTLS {
		c = testpki.Make(t, filepath.Join(dir, "pki"))
		args = append(args, "--tls-cert", c.ServerCert, "--tls-key", c.ServerKey, "--tls-ca", c.CA,
			"--tls-client-cert", c.ClientCert, "--tls-client-key", c.ClientKey)
	} else {
		args = append(args, "--no-tls")
	}
	var tlsMu sync.Mutex
	disableTLS := func() bool {
		tlsMu.Lock()
		defer tlsMu.Unlock()
		return disable
	}
	src := newRealVmigd(t, "src", bin, dir, args)
	dst := newRealVmigd(t, "dst", bin, dir, args)
	managerLog := &lockedBuffer{} // what the managers log, a line each
	manager := func(d *realVmigd) *VmigdProxyManager {
		logf := func(prefix string) func(string, ...interface{}) {
			return func(f string, a ...interface{}) {
				line := fmt.Sprintf(d.name+": "+prefix+f, a...)
				t.Log(line)
				fmt.Fprintln(managerLog, line)
			}
		}
		m := NewVmigdProxyManager(VmigdOptions{ControlSocket: d.control, DisableTLS: disableTLS,
			ResyncInterval: -1, Timeout: 5 * time.Second,
			Infof: logf(""), Warningf: logf("WARNING ")})
		t.Cleanup(m.Close)
		return m
	}
	mSrc, mDst := manager(src), manager(dst)

	// The target node: virt-launcher's sockets, as handleTargetMigrationProxy names them.
	key := "6f1c7a62-5bd1-4cf1-9b52-3c5b1d6c0a11"
	launcher := filepath.Join(dir, "t")
	files := kubevirtTargetFiles(launcher, key, false) // virtqemud-sock, KEY-49152-source.sock
	libvirtd := newEchoServer(t, files[0], "virtqemud-hello\n")
	qemu := newEchoServer(t, files[1], "")

	// Probe: a vmigd without KubeVirt mode answers in its own form.
	if err := mDst.StartTargetListener(key, files); err != nil {
		if strings.Contains(err.Error(), "KubeVirt mode") {
			t.Skipf("%s: %v", bin, err)
		}
		t.Fatal(err)
	}
	ports := mDst.GetTargetListenerPorts(key)
	if got := logicals(ports); !reflect.DeepEqual(got, []int{0, 49152}) {
		t.Fatalf("target ports %v", ports)
	}
	for tcp := range ports {
		if !tcpListening(tcp) {
			t.Errorf("nothing listens on published port %s", tcp)
		}
	}

	t.Run("target idempotent", func(t *testing.T) {
		if err := mDst.StartTargetListener(key, []string{files[1], files[0]}); err != nil {
			t.Fatal(err)
		}
		if got := mDst.GetTargetListenerPorts(key); !reflect.DeepEqual(got, ports) {
			t.Errorf("same files: ports %v, were %v", got, ports)
		}
	})

	srcBase := filepath.Join(dir, "s", "kubevirt")
	if err := os.MkdirAll(srcBase, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := mSrc.StartSourceListener(key, "127.0.0.1", ports, srcBase); err != nil {
		t.Fatal(err)
	}
	sock0 := SourceUnixFile(srcBase, key)
	sock49152 := SourceUnixFile(srcBase, ConstructProxyKey(key, 49152))
	t.Run("source files", func(t *testing.T) {
		got := mSrc.GetSourceListenerFiles(key)
		sort.Strings(got)
		want := []string{sock0, sock49152}
		sort.Strings(want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("files %v, want %v", got, want)
		}
		for _, f := range want {
			fi, err := os.Stat(f)
			if err != nil || fi.Mode()&os.ModeSocket == 0 {
				t.Errorf("%s: %v", f, err)
			} else if fi.Mode().Perm() != 0o660 {
				t.Logf("%s: mode %v (KubeVirt mode: 0660)", f, fi.Mode().Perm())
			}
		}
		// same arguments again, the map in another order: nothing changes
		again := map[string]int{}
		for k, v := range ports {
			again[k] = v
		}
		if err := mSrc.StartSourceListener(key, "127.0.0.1", again, srcBase); err != nil {
			t.Fatal(err)
		}
		if got := mSrc.GetSourceListenerFiles(key); len(got) != 2 {
			t.Errorf("after a repeated start: %v", got)
		}
	})

	t.Run("bytes end to end", func(t *testing.T) {
		before := atomic.LoadInt64(&qemu.received)
		// the libvirt connection: its far side speaks first
		if err := checkEcho(t, sock0, 4096, "virtqemud-hello\n"); err != nil {
			t.Fatalf("port 0: %v", err)
		}
		// QEMU's main channel and multifd channels: several at once, no order among them
		var wg sync.WaitGroup
		errs := make(chan error, 5)
		for i := 0; i < 5; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- checkEcho(t, sock49152, 2<<20, "")
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error("port 49152:", err)
			}
		}
		if got := atomic.LoadInt64(&qemu.received) - before; got != 5*2<<20 {
			t.Errorf("the target's unix server received %d bytes, want %d", got, 5*2<<20)
		}
		if atomic.LoadInt32(&libvirtd.conns) < 1 {
			t.Error("virtqemud's socket saw no connection")
		}
	})

	t.Run("counts and unknown keys", func(t *testing.T) {
		if n := mSrc.OpenListenerCount(); n != 1 {
			t.Errorf("source node count %d", n)
		}
		if n := mDst.OpenListenerCount(); n != 1 {
			t.Errorf("target node count %d", n)
		}
		if p := mDst.GetTargetListenerPorts("nope"); len(p) != 0 {
			t.Errorf("unknown key: %v", p)
		}
		if f := mSrc.GetSourceListenerFiles("nope"); f == nil || len(f) != 0 {
			t.Errorf("unknown key: %#v", f)
		}
		mDst.StopTargetListener("nope")
		mSrc.StopSourceListener("nope")
		if mSrc.OpenListenerCount() != 1 || mDst.OpenListenerCount() != 1 {
			t.Error("a stop of an unknown key changed the counts")
		}
	})

	t.Run("bandwidthPerMigration", func(t *testing.T) {
		const cap = 48 << 20
		mb := NewVmigdProxyManager(VmigdOptions{ControlSocket: src.control, DisableTLS: disableTLS,
			ResyncInterval: -1, BandwidthPerMigration: func() uint64 { return cap }})
		defer mb.Close()
		k := "bw-1"
		if err := mb.StartSourceListener(k, "127.0.0.1", ports, srcBase); err != nil {
			t.Fatal(err)
		}
		defer mb.StopSourceListener(k)
		capOf := func() (uint64, uint64) {
			list, err := mb.list()
			if err != nil {
				t.Fatal(err)
			}
			for _, mig := range list {
				if mig.Key == k && mig.Role == "source" {
					var ino uint64
					if fi, err := os.Stat(SourceUnixFile(srcBase, k)); err == nil {
						ino = fi.Sys().(*syscall.Stat_t).Ino
					}
					return mig.Cap, ino
				}
			}
			t.Fatalf("vmigd does not list source %s", k)
			return 0, 0
		}
		got, ino := capOf()
		if got != cap {
			t.Errorf("vmigd's cap for %s: %d, want %d", k, got, cap)
		}
		// the same start again: vmigd keeps the sockets (a different cap would remake them)
		if err := mb.StartSourceListener(k, "127.0.0.1", ports, srcBase); err != nil {
			t.Fatal(err)
		}
		if got2, ino2 := capOf(); got2 != cap || ino2 != ino || ino == 0 {
			t.Errorf("after a repeated start: cap %d, socket inode %d, were %d, %d", got2, ino2, cap, ino)
		}
	})

	t.Run("errors carry vmigd's message", func(t *testing.T) {
		gone := filepath.Join(dir, "no-such-launcher")
		err := mSrc.StartSourceListener("k-gone", "127.0.0.1", map[string]int{"1": 49152}, gone)
		var ve *VmigdError
		if !errors.As(err, &ve) || ve.Msg == "" {
			t.Fatalf("missing directory: %#v", err)
		}
		if ve.Code == "" {
			t.Errorf("no errno name in %q", err)
		}
		t.Logf("missing directory: %v", err)
		// one socket path claimed by two migrations: "col" port 49152 and "col-49152" port 0
		// both name col-49152-source.sock
		if err := mSrc.StartSourceListener("col", "127.0.0.1", map[string]int{"1": 49152}, srcBase); err != nil {
			t.Fatal(err)
		}
		err = mSrc.StartSourceListener("col-49152", "127.0.0.1", map[string]int{"2": 0}, srcBase)
		if !errors.As(err, &ve) || ve.Code != "EEXIST" || !strings.Contains(ve.Msg, "col") {
			t.Errorf("hijack: %v", err)
		} else {
			t.Logf("hijack: %v", err)
		}
		mSrc.StopSourceListener("col")
		mSrc.StopSourceListener("col-49152")
		// a logical port KubeVirt does not have
		err = mSrc.StartSourceListener("odd", "127.0.0.1", map[string]int{"3": 1}, srcBase)
		if !errors.As(err, &ve) || ve.Code != "EINVAL" {
			t.Errorf("logical port 1: %v", err)
		}
		if mSrc.OpenListenerCount() != 1 {
			t.Errorf("count %d", mSrc.OpenListenerCount())
		}
	})

	if withTLS {
		t.Run("disableTLS per migration", func(t *testing.T) {
			tlsMu.Lock()
			disable = true
			tlsMu.Unlock()
			defer func() {
				tlsMu.Lock()
				disable = false
				tlsMu.Unlock()
			}()
			k := "plain-1"
			pf := kubevirtTargetFiles(filepath.Join(dir, "p"), k, false)
			newEchoServer(t, pf[0], "")
			newEchoServer(t, pf[1], "")
			if err := mDst.StartTargetListener(k, pf); err != nil {
				t.Fatal(err)
			}
			if err := mSrc.StartSourceListener(k, "127.0.0.1", mDst.GetTargetListenerPorts(k), srcBase); err != nil {
				t.Fatal(err)
			}
			if err := checkEcho(t, SourceUnixFile(srcBase, ConstructProxyKey(k, 49152)), 1<<20, ""); err != nil {
				t.Error(err)
			}
			// a plain source against a TLS target is no migration
			if err := mSrc.StartSourceListener("mixed", "127.0.0.1", ports, srcBase); err != nil {
				t.Fatal(err)
			}
			if err := checkEcho(t, SourceUnixFile(srcBase, ConstructProxyKey("mixed", 49152)), 4096, ""); err == nil {
				t.Error("a plain source got through a TLS target")
			}
			mSrc.StopSourceListener("mixed")
			mSrc.StopSourceListener(k)
			mDst.StopTargetListener(k)
		})
	}

	// A stock virt-handler on the other node (reference §5): no ALPN, so vmigd speaks raw.
	t.Run("stock peers", func(t *testing.T) {
		var clientCfg, serverCfg *tls.Config
		if withTLS {
			clientCfg, serverCfg = stockTLSConfigs(t, c)
		}
		// stock source -> vmigd target: one TCP (TLS) connection per QEMU connection
		var tcp49152 string
		for p, l := range ports {
			if l == 49152 {
				tcp49152 = p
			}
		}
		addr := net.JoinHostPort("127.0.0.1", tcp49152)
		var conn net.Conn
		var err error
		if withTLS {
			conn, err = tls.Dial("tcp", addr, clientCfg)
		} else {
			conn, err = net.Dial("tcp", addr)
		}
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, 1<<20)
		rand.Read(data)
		go conn.Write(data)
		back := make([]byte, len(data))
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadFull(conn, back); err != nil || !bytes.Equal(back, data) {
			t.Errorf("stock source through the vmigd target: %v", err)
		}
		conn.Close()
		// vmigd source -> stock target
		var ln net.Listener
		if withTLS {
			ln, err = tls.Listen("tcp", "127.0.0.1:0", serverCfg)
		} else {
			ln, err = net.Listen("tcp", "127.0.0.1:0")
		}
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					io.Copy(c, c)
				}()
			}
		}()
		_, sp, _ := net.SplitHostPort(ln.Addr().String())
		if err := mSrc.StartSourceListener("stock-t", "127.0.0.1", map[string]int{sp: 49152}, srcBase); err != nil {
			t.Fatal(err)
		}
		if err := checkEcho(t, SourceUnixFile(srcBase, ConstructProxyKey("stock-t", 49152)), 1<<20, ""); err != nil {
			t.Errorf("vmigd source to a stock target: %v", err)
		}
		mSrc.StopSourceListener("stock-t")
		for _, d := range []*realVmigd{src, dst} {
			if !strings.Contains(d.log.String(), "wire=raw") {
				t.Errorf("vmigd %s logged no raw link", d.name)
			}
		}
	})

	files2 := kubevirtTargetFiles(launcher, key, true) // block migration: + KEY-49153
	nbd := newEchoServer(t, files2[2], "NBDMAGIC")     // for the rest of the scenario
	t.Run("target replaced", func(t *testing.T) {
		if err := mDst.StartTargetListener(key, files2); err != nil {
			t.Fatal(err)
		}
		ports2 := mDst.GetTargetListenerPorts(key)
		if got := logicals(ports2); !reflect.DeepEqual(got, []int{0, 49152, 49153}) {
			t.Fatalf("ports %v", ports2)
		}
		for tcp := range ports2 {
			if _, old := ports[tcp]; old {
				t.Errorf("replaced listeners kept port %s", tcp)
			}
		}
		waitFor(t, "old ports closed", func() bool {
			for tcp := range ports {
				if tcpListening(tcp) {
					return false
				}
			}
			return true
		})
		// the source, given the new map, follows
		if err := mSrc.StartSourceListener(key, "127.0.0.1", ports2, srcBase); err != nil {
			t.Fatal(err)
		}
		if len(mSrc.GetSourceListenerFiles(key)) != 3 {
			t.Errorf("source files %v", mSrc.GetSourceListenerFiles(key))
		}
		if err := checkEcho(t, SourceUnixFile(srcBase, ConstructProxyKey(key, 49153)), 1<<20, "NBDMAGIC"); err != nil {
			t.Errorf("NBD: %v", err)
		}
		if atomic.LoadInt32(&nbd.conns) != 1 {
			t.Errorf("NBD server saw %d connections", nbd.conns)
		}
		if err := checkEcho(t, sock49152, 1<<20, ""); err != nil {
			t.Error(err)
		}
		ports = ports2
	})

	t.Run("vmigd restarts", func(t *testing.T) {
		// a migration prepared on both nodes that has not connected yet
		kp := "k-pending"
		fp := kubevirtTargetFiles(filepath.Join(dir, "pending"), kp, false)
		newEchoServer(t, fp[0], "")
		pendingQemu := newEchoServer(t, fp[1], "")
		if err := mDst.StartTargetListener(kp, fp); err != nil {
			t.Fatal(err)
		}
		if err := mSrc.StartSourceListener(kp, "127.0.0.1", mDst.GetTargetListenerPorts(kp), srcBase); err != nil {
			t.Fatal(err)
		}
		sockPending := SourceUnixFile(srcBase, ConstructProxyKey(kp, 49152))

		// the source node's vmigd dies: its source sockets are made again; the target's ports
		// did not change, so the migration that had not begun goes ahead
		oldPid := src.pid()
		src.kill()
		src.start()
		if src.pid() == oldPid {
			t.Fatal("same pid")
		}
		if err := mSrc.Sync(); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{sock0, sock49152, sockPending} {
			if _, err := os.Stat(f); err != nil {
				t.Errorf("not made again: %v", err)
			}
		}
		if err := checkEcho(t, sockPending, 1<<20, ""); err != nil {
			t.Errorf("after the source vmigd restarted: %v", err)
		}
		if atomic.LoadInt64(&pendingQemu.received) != 1<<20 {
			t.Errorf("the pending migration's target received %d bytes", pendingQemu.received)
		}
		mSrc.StopSourceListener(kp)
		mDst.StopTargetListener(kp)
		// (A migration that was running when its source vmigd died has failed: KubeVirt retries
		// it against a new target, so its old target listeners are not used again. Between two
		// vmigd over TLS they would refuse it: the new source numbers connections from 0 again.)

		// the target node's vmigd dies (SIGKILL) with a migration prepared on both nodes whose
		// connections have not come yet: KubeVirt published the target's ports once, so the
		// listeners are made again on those very ports, and the source, which dials the old
		// port numbers, reaches the target's unix socket
		kq := "k-prepared"
		fq := launcherDirs(t, kubevirtTargetFiles(filepath.Join(dir, "prepared"), kq, false))
		newEchoServer(t, fq[0], "")
		preparedQemu := newEchoServer(t, fq[1], "")
		if err := mDst.StartTargetListener(kq, fq); err != nil {
			t.Fatal(err)
		}
		published := mDst.GetTargetListenerPorts(kq)
		if err := mSrc.StartSourceListener(kq, "127.0.0.1", published, srcBase); err != nil {
			t.Fatal(err)
		}
		sockPrepared := SourceUnixFile(srcBase, ConstructProxyKey(kq, 49152))
		// and one whose port another process takes while vmigd is down
		kz := "k-taken"
		fz := launcherDirs(t, kubevirtTargetFiles(filepath.Join(dir, "taken"), kz, false))
		if err := mDst.StartTargetListener(kz, fz); err != nil {
			t.Fatal(err)
		}
		publishedZ := mDst.GetTargetListenerPorts(kz)
		var takenPort string
		for tcp, l := range publishedZ {
			if l == 49152 {
				takenPort = tcp
			}
		}
		oldPid = dst.pid()
		dst.kill()
		squatter, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", takenPort))
		if err != nil {
			t.Fatalf("cannot take port %s: %v", takenPort, err)
		}
		defer squatter.Close()
		dst.start()
		if dst.pid() == oldPid {
			t.Fatal("same pid")
		}
		// noticed by the next start, with no Sync call
		k3 := "k3"
		f3 := launcherDirs(t, kubevirtTargetFiles(filepath.Join(dir, "3"), k3, false))
		if err := mDst.StartTargetListener(k3, f3); err != nil {
			t.Fatal(err)
		}
		if got := mDst.GetTargetListenerPorts(kq); !reflect.DeepEqual(got, published) {
			t.Fatalf("after the restart: %s's ports %v, published %v", kq, got, published)
		}
		ports3 := mDst.GetTargetListenerPorts(key)
		if !reflect.DeepEqual(ports3, ports) {
			t.Fatalf("after the restart: ports %v, were %v", ports3, ports)
		}
		for tcp := range published {
			if !tcpListening(tcp) {
				t.Errorf("nothing listens on published port %s after the restart", tcp)
			}
		}
		if err := checkEcho(t, sockPrepared, 1<<20, ""); err != nil {
			t.Errorf("the prepared migration after the target vmigd restarted: %v", err)
		}
		if got := atomic.LoadInt64(&preparedQemu.received); got != 1<<20 {
			t.Errorf("the prepared migration's target socket received %d bytes", got)
		}
		if !strings.Contains(dst.log.String(), "migration "+kq+" role=target start") {
			t.Errorf("the restarted target vmigd does not log %s's start", kq)
		}
		// the taken port: an error naming the key, the ports and EADDRINUSE; the key is still
		// held, on new ports
		wantErr := "error: vmigd: target " + kz + " cannot listen again on its published ports " +
			vmigdPortsString(publishedZ)
		if l := managerLog.String(); !strings.Contains(l, wantErr) ||
			!strings.Contains(l, "TCP port "+takenPort+": Address already in use (EADDRINUSE)") {
			t.Errorf("no error line for %s's taken port %s:\n%s", kz, takenPort, l)
		}
		if got := mDst.GetTargetListenerPorts(kz); len(got) != len(publishedZ) || reflect.DeepEqual(got, publishedZ) {
			t.Errorf("%s after its port was taken: ports %v, published %v", kz, got, publishedZ)
		}
		mDst.StopTargetListener(kz)
		mSrc.StopSourceListener(kq)
		mDst.StopTargetListener(kq)
		// the migration that was running (its source numbered its connections for the old
		// target) is retried by KubeVirt: a new source start on the same ports
		mSrc.StopSourceListener(key)
		if err := mSrc.StartSourceListener(key, "127.0.0.1", ports3, srcBase); err != nil {
			t.Fatal(err)
		}
		if err := checkEcho(t, sock49152, 1<<20, ""); err != nil {
			t.Errorf("after the target vmigd restarted: %v", err)
		}
		mDst.StopTargetListener(k3)
		ports = ports3
	})

	t.Run("virt-handler restarts, vmigd keeps running", func(t *testing.T) {
		m2 := manager(dst)
		if err := m2.Sync(); err != nil {
			t.Fatal(err)
		}
		if got := m2.GetTargetListenerPorts(key); !reflect.DeepEqual(got, ports) {
			t.Errorf("adopted ports %v, want %v", got, ports)
		}
		if m2.OpenListenerCount() != 1 {
			t.Errorf("count %d", m2.OpenListenerCount())
		}
		// the same files again from the new handler: the same ports
		if err := m2.StartTargetListener(key, kubevirtTargetFiles(launcher, key, true)); err != nil {
			t.Fatal(err)
		}
		if got := m2.GetTargetListenerPorts(key); !reflect.DeepEqual(got, ports) {
			t.Errorf("ports %v after a repeated start, want %v", got, ports)
		}
		s2 := manager(src)
		if err := s2.Sync(); err != nil {
			t.Fatal(err)
		}
		got := s2.GetSourceListenerFiles(key)
		if len(got) != 3 {
			t.Errorf("adopted source files %v", got)
		}
		// what list says is enough to make the source again after a vmigd restart
		s2.mu.Lock()
		if s := s2.sources[key]; s == nil || s.partial || s.address != "127.0.0.1" ||
			!reflect.DeepEqual(s.portMap, ports) || s.baseDir != srcBase {
			t.Errorf("adopted source %+v, want address 127.0.0.1, ports %v, dir %s", s, ports, srcBase)
		}
		if tg := m2.targets[key]; tg == nil || tg.partial {
			t.Errorf("adopted target %+v", tg)
		}
		s2.mu.Unlock()
	})

	t.Run("stop", func(t *testing.T) {
		mSrc.StopSourceListener(key)
		for _, f := range []string{sock0, sock49152} {
			if _, err := os.Stat(f); err == nil {
				t.Errorf("%s still there", f)
			}
		}
		mDst.StopTargetListener(key)
		waitFor(t, "target ports closed", func() bool {
			for tcp := range ports {
				if tcpListening(tcp) {
					return false
				}
			}
			return true
		})
		if mSrc.OpenListenerCount()+mDst.OpenListenerCount() != 0 {
			t.Error("counts not 0")
		}
	})

	t.Run("vmigd taken over", func(t *testing.T) {
		// a migration prepared on both nodes whose connections have not come yet when the
		// target node's vmigd is taken over (vmigd --takeover): the old vmigd keeps a
		// KubeVirt-mode target with its listeners, so its ports stay; the manager does not ask
		// the new vmigd for it, and the source, dialling the published ports, reaches the
		// target's unix socket through the old one
		kt := "k-takeover"
		ft := launcherDirs(t, kubevirtTargetFiles(filepath.Join(dir, "takeover"), kt, false))
		newEchoServer(t, ft[0], "")
		tq := newEchoServer(t, ft[1], "")
		if err := mDst.StartTargetListener(kt, ft); err != nil {
			t.Fatal(err)
		}
		published := mDst.GetTargetListenerPorts(kt)
		if err := mSrc.StartSourceListener(kt, "127.0.0.1", published, srcBase); err != nil {
			t.Fatal(err)
		}
		oldPid, oldExited := dst.takeover()
		starts := strings.Count(dst.log.String(), "migration "+kt+" role=target start")
		if err := mDst.Sync(); err != nil {
			t.Fatal(err)
		}
		if got := mDst.GetTargetListenerPorts(kt); !reflect.DeepEqual(got, published) {
			t.Errorf("after the takeover: ports %v, published %v", got, published)
		}
		if n := strings.Count(dst.log.String(), "migration "+kt+" role=target start"); n != starts {
			t.Errorf("the target was started again after the takeover (%d start lines, were %d)", n, starts)
		}
		if l := managerLog.String(); !strings.Contains(l, "target "+kt+" stays with the vmigd this one took over from") {
			t.Errorf("the manager does not say %s stayed with the old vmigd:\n%s", kt, l)
		}
		if err := checkEcho(t, SourceUnixFile(srcBase, ConstructProxyKey(kt, 49152)), 1<<20, ""); err != nil {
			t.Errorf("the prepared migration after the takeover: %v", err)
		}
		if got := atomic.LoadInt64(&tq.received); got != 1<<20 {
			t.Errorf("the target socket received %d bytes", got)
		}
		// the stops reach the old vmigd (passed on by the new one), which then exits
		mSrc.StopSourceListener(kt)
		mDst.StopTargetListener(kt)
		select {
		case <-oldExited:
		case <-time.After(20 * time.Second):
			t.Errorf("the old vmigd (pid %d) still runs 20 s after its migration was stopped", oldPid)
		}
	})

	t.Run("graceful shutdown", func(t *testing.T) {
		k := "k4"
		f4 := launcherDirs(t, kubevirtTargetFiles(filepath.Join(dir, "4"), k, false))
		if err := mDst.StartTargetListener(k, f4); err != nil {
			t.Fatal(err)
		}
		mDst.InitiateGracefulShutdown()
		if err := mDst.StartTargetListener("k5", f4); err == nil || err.Error() != vmigdShutdownError {
			t.Errorf("start while shutting down: %v", err)
		}
		if n := mDst.OpenListenerCount(); n != 1 {
			t.Errorf("count %d while vmigd runs", n)
		}
		// the pod goes: vmigd drains (nothing in flight) and exits
		if !dst.signal(syscall.SIGTERM, 10*time.Second) {
			t.Fatal("vmigd did not exit on SIGTERM")
		}
		if n := mDst.OpenListenerCount(); n != 0 {
			t.Errorf("count %d with vmigd gone", n)
		}
	})
}

// stockTLSConfigs are KubeVirt's (pkg/util/tls/tls.go:173-262, reference §4-5): no ALPN, no
// hostname check, the CA, the extended key usage and the CN checked by hand.
func stockTLSConfigs(t *testing.T, c testpki.Certs) (client, server *tls.Config) {
	caPEM, err := os.ReadFile(c.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	verify := func(usage x509.ExtKeyUsage, cn string) func([][]byte, [][]*x509.Certificate) error {
		return func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("no certificate")
			}
			leaf, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				return err
			}
			if leaf.Subject.CommonName != cn {
				return fmt.Errorf("CN %q", leaf.Subject.CommonName)
			}
			return nil
		}
	}
	clientPair, err := tls.LoadX509KeyPair(c.ClientCert, c.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	serverPair, err := tls.LoadX509KeyPair(c.ServerCert, c.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	client = &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{clientPair},
		VerifyPeerCertificate: verify(x509.ExtKeyUsageServerAuth, "kubevirt.io:system:node:virt-handler")}
	server = &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{serverPair},
		ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS12,
		VerifyPeerCertificate: verify(x509.ExtKeyUsageClientAuth, "kubevirt.io:system:client:migration")}
	return client, server
}
