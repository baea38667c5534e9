// SPDX-License-Identifier: Apache-2.0
// The manager against a scripted control socket that speaks the protocol of doc/interfaces.md
// (KubeVirt mode): cache, idempotency, restarts, timeouts and errors, with no vmigd and no root.
// vmigd_test.go runs the same calls against the real daemon.

package vmigdproxy

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeTarget struct {
	sockets map[string]string
	tls     bool
	ports   map[string]int
}

type fakeSource struct {
	address string
	ports   map[string]int
	dir     string
	tls     bool
	cap     uint64
	files   []string
}

// fakeVmigd answers one JSON request per connection, as vmigd does.
type fakeVmigd struct {
	t    *testing.T
	path string

	mu       sync.Mutex
	ln       net.Listener
	pid      int
	nextPort int
	targets  map[string]*fakeTarget
	sources  map[string]*fakeSource
	reqs     []map[string]interface{}
	wedged   chan struct{} // non-nil: read the request, answer nothing until closed
	refuse   map[string][2]string
	ownForm  bool                   // answer target-start in vmigd's own form, as a vmigd without KubeVirt mode
	taken    map[int]bool           // TCP ports another process holds: "listen" on one fails
	takeover map[string]interface{} // status's "takeover", nil for none
	wg       sync.WaitGroup
}

func newFakeVmigd(t *testing.T) *fakeVmigd {
	f := &fakeVmigd{t: t, path: filepath.Join(t.TempDir(), "control.sock"), pid: 4000,
		nextPort: 40000, refuse: map[string][2]string{}, taken: map[int]bool{}}
	f.reset()
	f.listen()
	t.Cleanup(f.close)
	return f
}

func (f *fakeVmigd) reset() {
	f.targets = map[string]*fakeTarget{}
	f.sources = map[string]*fakeSource{}
}

// listen binds a new socket beside the path and renames it over: a new inode every time, as a
// restarted vmigd's socket is.
func (f *fakeVmigd) listen() {
	tmp := f.path + ".new"
	os.Remove(tmp)
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		f.t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Rename(tmp, f.path); err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	f.ln = ln
	f.mu.Unlock()
	f.wg.Add(1)
	go f.serve(ln)
}

func (f *fakeVmigd) close() {
	f.mu.Lock()
	ln := f.ln
	f.ln = nil
	if f.wedged != nil {
		close(f.wedged)
		f.wedged = nil
	}
	f.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	f.wg.Wait()
}

// restart: a new daemon, a new pid, nothing carried over.
func (f *fakeVmigd) restart() {
	f.close()
	os.Remove(f.path)
	f.mu.Lock()
	f.pid++
	f.reset()
	f.mu.Unlock()
	f.listen()
}

// down: the daemon exited and removed its socket.
func (f *fakeVmigd) down() {
	f.close()
	os.Remove(f.path)
}

func (f *fakeVmigd) wedge() {
	f.mu.Lock()
	f.wedged = make(chan struct{})
	f.mu.Unlock()
}

func (f *fakeVmigd) unwedge() {
	f.mu.Lock()
	if f.wedged != nil {
		close(f.wedged)
		f.wedged = nil
	}
	f.mu.Unlock()
}

func (f *fakeVmigd) has(role, key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if role == "target" {
		return f.targets[key] != nil
	}
	return f.sources[key] != nil
}

func (f *fakeVmigd) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.targets) + len(f.sources)
}

func (f *fakeVmigd) requests(op string) []map[string]interface{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []map[string]interface{}
	for _, r := range f.reqs {
		if op == "" || r["op"] == op {
			out = append(out, r)
		}
	}
	return out
}

func (f *fakeVmigd) serve(ln net.Listener) {
	defer f.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer c.Close()
			line, err := bufio.NewReader(c).ReadBytes('\n')
			if err != nil {
				return
			}
			var req map[string]interface{}
			if err := json.Unmarshal(line, &req); err != nil {
				f.t.Errorf("fake vmigd: bad request %q", line)
				return
			}
			f.mu.Lock()
			f.reqs = append(f.reqs, req)
			wedged := f.wedged
			f.mu.Unlock()
			if wedged != nil {
				<-wedged
				return
			}
			b, _ := json.Marshal(f.answer(req))
			c.Write(append(b, '\n'))
		}()
	}
}

func fakeErr(code, msg string) map[string]interface{} {
	return map[string]interface{}{"ok": false, "error": msg, "code": code}
}

func (f *fakeVmigd) answer(req map[string]interface{}) map[string]interface{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	op, _ := req["op"].(string)
	key, _ := req["key"].(string)
	if r, ok := f.refuse[op]; ok {
		return fakeErr(r[0], r[1])
	}
	tls := true
	if v, ok := req["tls"].(bool); ok {
		tls = v
	}
	switch op {
	case "status":
		st := map[string]interface{}{"version": "0.1.0", "pid": f.pid}
		if f.takeover != nil {
			st["takeover"] = f.takeover
		}
		return map[string]interface{}{"ok": true, "version": 2, "status": st}
	case "target-start":
		if req["kubevirt"] != true {
			return fakeErr("EINVAL", "fake: kubevirt mode only")
		}
		sockets := map[string]string{}
		for k, v := range req["sockets"].(map[string]interface{}) {
			sockets[k] = v.(string)
		}
		if len(sockets) == 0 {
			return fakeErr("EINVAL", "target-start: no sockets")
		}
		listen := map[string]int{}
		if l, ok := req["listen"].(map[string]interface{}); ok {
			for id, tcp := range l {
				if _, ok := sockets[id]; !ok {
					return fakeErr("EINVAL", "listen: port "+id+" has no socket in \"sockets\"")
				}
				listen[id] = int(tcp.(float64))
			}
		}
		t := f.targets[key]
		if t == nil || !reflect.DeepEqual(t.sockets, sockets) || t.tls != tls {
			t = &fakeTarget{sockets: sockets, tls: tls, ports: map[string]int{}}
			var ids []string
			for id := range sockets {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			for _, id := range ids {
				n, _ := strconv.Atoi(id)
				tcp := listen[id]
				if tcp == 0 {
					f.nextPort++
					tcp = f.nextPort
				} else if f.taken[tcp] {
					return fakeErr("EADDRINUSE", fmt.Sprintf("cannot listen for port %d on TCP port %d: "+
						"Address already in use (EADDRINUSE)", n, tcp))
				}
				t.ports[strconv.Itoa(tcp)] = n
			}
			f.targets[key] = t
		}
		if f.ownForm {
			return map[string]interface{}{"ok": true, "target": map[string]interface{}{
				"version": 1, "key": key, "address": "198.18.0.2", "port": 40001, "ports": []int{49152, 0}}}
		}
		return map[string]interface{}{"ok": true, "target": map[string]interface{}{
			"targetNodeAddress": "198.18.0.2", "targetDirectMigrationNodePorts": t.ports,
			"key": key, "tls": tls}}
	case "source-start":
		tgt := req["target"].(map[string]interface{})
		s := &fakeSource{address: tgt["targetNodeAddress"].(string), ports: map[string]int{},
			dir: req["dir"].(string), tls: tls}
		if bw, ok := req["bandwidth"].(float64); ok {
			s.cap = uint64(bw)
		}
		for k, v := range tgt["targetDirectMigrationNodePorts"].(map[string]interface{}) {
			s.ports[k] = int(v.(float64))
		}
		if old := f.sources[key]; old != nil && old.address == s.address &&
			reflect.DeepEqual(old.ports, s.ports) && old.dir == s.dir && old.tls == s.tls &&
			old.cap == s.cap {
			return map[string]interface{}{"ok": true, "sockets": old.files}
		}
		var logicals []int
		for _, l := range s.ports {
			logicals = append(logicals, l)
		}
		sort.Ints(logicals)
		for _, l := range logicals {
			s.files = append(s.files, SourceUnixFile(s.dir, ConstructProxyKey(key, l)))
		}
		f.sources[key] = s
		return map[string]interface{}{"ok": true, "sockets": s.files}
	case "target-stop", "source-stop":
		if op == "target-stop" {
			if f.targets[key] == nil {
				return fakeErr("ENOENT", "target-stop: no migration "+key)
			}
			delete(f.targets, key)
		} else {
			if f.sources[key] == nil {
				return fakeErr("ENOENT", "source-stop: no migration "+key)
			}
			delete(f.sources, key)
		}
		return map[string]interface{}{"ok": true}
	case "list":
		var migs []interface{}
		for k, t := range f.targets {
			var ports []interface{}
			for tcp, l := range t.ports {
				n, _ := strconv.Atoi(tcp)
				ports = append(ports, map[string]interface{}{"id": l, "socket": t.sockets[strconv.Itoa(l)], "listen": n})
			}
			migs = append(migs, map[string]interface{}{"key": k, "role": "target", "kubevirt": true,
				"tls": t.tls, "ports": ports})
		}
		for k, s := range f.sources {
			var ports []interface{}
			for tcp, l := range s.ports {
				n, _ := strconv.Atoi(tcp)
				ports = append(ports, map[string]interface{}{"id": l,
					"socket": SourceUnixFile(s.dir, ConstructProxyKey(k, l)), "peer_port": n})
			}
			migs = append(migs, map[string]interface{}{"key": k, "role": "source", "kubevirt": true,
				"tls": s.tls, "ports": ports, "peer": s.address, "cap": s.cap})
		}
		return map[string]interface{}{"ok": true, "version": 2, "migrations": migs}
	}
	return fakeErr("EINVAL", "unknown op "+op)
}

func newTestManager(t *testing.T, f *fakeVmigd, opts VmigdOptions) *VmigdProxyManager {
	opts.ControlSocket = f.path
	if opts.ResyncInterval == 0 {
		opts.ResyncInterval = -1
	}
	if opts.Timeout == 0 {
		opts.Timeout = 2 * time.Second
	}
	opts.Infof = t.Logf
	opts.Warningf = t.Logf
	m := NewVmigdProxyManager(opts)
	t.Cleanup(m.Close)
	return m
}

// kubevirtTargetFiles are the files handleTargetMigrationProxy passes (migration-target.go:739-762).
func kubevirtTargetFiles(dir, key string, block bool) []string {
	files := []string{filepath.Join(dir, "libvirt/virtqemud-sock"),
		SourceUnixFile(filepath.Join(dir, "kubevirt"), ConstructProxyKey(key, LibvirtDirectMigrationPort))}
	if block {
		files = append(files, SourceUnixFile(filepath.Join(dir, "kubevirt"), ConstructProxyKey(key, LibvirtBlockMigrationPort)))
	}
	return files
}

func logicals(ports map[string]int) []int {
	var l []int
	for _, v := range ports {
		l = append(l, v)
	}
	sort.Ints(l)
	return l
}

const testKey = "6f1c7a62-5bd1-4cf1-9b52-3c5b1d6c0a11"

func TestLogicalPortRule(t *testing.T) {
	key := testKey
	base := "/proc/1234/root/var/run"
	cases := map[string]int{
		base + "/libvirt/virtqemud-sock":                                0,
		base + "/kubevirt/migrationproxy/" + key + "-49152-source.sock": 49152,
		base + "/kubevirt/migrationproxy/" + key + "-49153-source.sock": 49153,
		base + "/kubevirt/migrationproxy/" + key + "-source.sock":       0,
		base + "/kubevirt/migrationproxy/other-uid-49152-source.sock":   0,
		"/x/" + key + "-49152/" + key + "-49153-source.sock":            49152, // 49152 is tried first, as upstream
	}
	for path, want := range cases {
		if got := vmigdLogicalPort(key, path); got != want {
			t.Errorf("%s: logical port %d, want %d", path, got, want)
		}
	}
}

func TestTargetCacheAndIdempotency(t *testing.T) {
	f := newFakeVmigd(t)
	m := newTestManager(t, f, VmigdOptions{})
	dir := t.TempDir()

	if got := m.GetTargetListenerPorts("unknown"); got == nil || len(got) != 0 {
		t.Fatalf("unknown key: %v, want an empty map", got)
	}
	files := kubevirtTargetFiles(dir, testKey, true)
	if err := m.StartTargetListener(testKey, files); err != nil {
		t.Fatal(err)
	}
	ports := m.GetTargetListenerPorts(testKey)
	if !reflect.DeepEqual(logicals(ports), []int{0, 49152, 49153}) {
		t.Fatalf("ports %v", ports)
	}
	req := f.requests("target-start")[0]
	if req["kubevirt"] != true || req["tls"] != true {
		t.Errorf("request %v: want kubevirt and tls true", req)
	}
	socks := req["sockets"].(map[string]interface{})
	if socks["0"] != files[0] || socks["49152"] != files[1] || socks["49153"] != files[2] {
		t.Errorf("sockets %v for files %v", socks, files)
	}

	// every reconcile asks; none of that reaches vmigd
	n := len(f.requests(""))
	for i := 0; i < 100; i++ {
		if !reflect.DeepEqual(m.GetTargetListenerPorts(testKey), ports) {
			t.Fatal("ports moved")
		}
	}
	if len(f.requests("")) != n {
		t.Errorf("GetTargetListenerPorts sent requests")
	}
	// the result is a copy
	for k := range ports {
		delete(ports, k)
	}
	if len(m.GetTargetListenerPorts(testKey)) != 3 {
		t.Error("a caller's change reached the cache")
	}
	ports = m.GetTargetListenerPorts(testKey)

	// same files, in another order: same ports
	rev := []string{files[2], files[0], files[1]}
	if err := m.StartTargetListener(testKey, rev); err != nil {
		t.Fatal(err)
	}
	if got := m.GetTargetListenerPorts(testKey); !reflect.DeepEqual(got, ports) {
		t.Errorf("same files: %v, was %v", got, ports)
	}
	// other files: replaced, new ports
	files2 := kubevirtTargetFiles(t.TempDir(), testKey, false)
	if err := m.StartTargetListener(testKey, files2); err != nil {
		t.Fatal(err)
	}
	got := m.GetTargetListenerPorts(testKey)
	if !reflect.DeepEqual(logicals(got), []int{0, 49152}) {
		t.Fatalf("replaced: %v", got)
	}
	for tcp := range got {
		if _, old := ports[tcp]; old {
			t.Errorf("replaced listeners kept port %s", tcp)
		}
	}
	if c := m.OpenListenerCount(); c != 1 {
		t.Errorf("OpenListenerCount %d, want 1", c)
	}
	m.StopTargetListener(testKey)
	if len(m.GetTargetListenerPorts(testKey)) != 0 || m.OpenListenerCount() != 0 {
		t.Error("stop left the key")
	}
	if f.has("target", testKey) {
		t.Error("vmigd still has the target")
	}
}

func TestSourceCacheAndIdempotency(t *testing.T) {
	f := newFakeVmigd(t)
	m := newTestManager(t, f, VmigdOptions{})
	base := t.TempDir()
	pm := map[string]int{"40001": 49152, "40002": 0}

	if got := m.GetSourceListenerFiles("unknown"); got == nil || len(got) != 0 {
		t.Fatalf("unknown key: %#v, want an empty list", got)
	}
	if err := m.StartSourceListener(testKey, "fd00::2", pm, base); err != nil {
		t.Fatal(err)
	}
	want := []string{SourceUnixFile(base, testKey), SourceUnixFile(base, testKey+"-49152")}
	if got := m.GetSourceListenerFiles(testKey); !reflect.DeepEqual(got, want) {
		t.Errorf("files %v, want %v", got, want)
	}
	req := f.requests("source-start")[0]
	tgt := req["target"].(map[string]interface{})
	if tgt["targetNodeAddress"] != "fd00::2" || req["dir"] != base || req["tls"] != true {
		t.Errorf("request %v", req)
	}
	if err := m.StartSourceListener(testKey, "fd00::2", map[string]int{"40002": 0, "40001": 49152}, base); err != nil {
		t.Fatal(err)
	}
	if len(f.requests("source-start")) != 2 {
		t.Error("a repeated start must still reach vmigd (idempotency is vmigd's)")
	}
	if err := m.StartTargetListener(testKey, kubevirtTargetFiles(base, testKey, false)); err != nil {
		t.Fatal(err)
	}
	if c := m.OpenListenerCount(); c != 2 {
		t.Errorf("OpenListenerCount %d, want 2 (one source key, one target key)", c)
	}
	m.StopSourceListener(testKey)
	if len(m.GetSourceListenerFiles(testKey)) != 0 || m.OpenListenerCount() != 1 {
		t.Error("source stop")
	}
}

func TestStopUnknownKey(t *testing.T) {
	f := newFakeVmigd(t)
	var warnings []string
	m := newTestManager(t, f, VmigdOptions{})
	m.opts.Warningf = func(format string, args ...interface{}) {
		warnings = append(warnings, fmt.Sprintf(format, args...))
	}
	m.StopTargetListener("nobody")
	m.StopSourceListener("nobody")
	if len(f.requests("target-stop")) != 1 || len(f.requests("source-stop")) != 1 {
		t.Error("a stop of a key the cache does not know must still reach vmigd")
	}
	if len(warnings) != 0 {
		t.Errorf("ENOENT is no error: %v", warnings)
	}
}

func TestGracefulShutdown(t *testing.T) {
	f := newFakeVmigd(t)
	m := newTestManager(t, f, VmigdOptions{})
	if err := m.StartTargetListener(testKey, kubevirtTargetFiles(t.TempDir(), testKey, false)); err != nil {
		t.Fatal(err)
	}
	m.InitiateGracefulShutdown()
	err := m.StartTargetListener("k2", kubevirtTargetFiles(t.TempDir(), "k2", false))
	if err == nil || err.Error() != vmigdShutdownError {
		t.Errorf("start after shutdown: %v", err)
	}
	if err := m.StartSourceListener("k2", "198.18.0.2", map[string]int{"1": 0}, t.TempDir()); err == nil {
		t.Error("source start after shutdown succeeded")
	}
	if c := m.OpenListenerCount(); c != 1 {
		t.Errorf("count %d while vmigd runs, want 1", c)
	}
	m.StopTargetListener(testKey)
	if c := m.OpenListenerCount(); c != 0 {
		t.Errorf("count %d after stop", c)
	}
	// a key left when vmigd has gone: nothing to wait for
	m.mu.Lock()
	m.targets["left"] = &vmigdTarget{}
	m.mu.Unlock()
	if c := m.OpenListenerCount(); c != 1 {
		t.Errorf("count %d", c)
	}
	f.down()
	if c := m.OpenListenerCount(); c != 0 {
		t.Errorf("count %d with vmigd gone, want 0", c)
	}
}

func TestDisableTLSPerMigration(t *testing.T) {
	f := newFakeVmigd(t)
	disable := true
	var mu sync.Mutex
	m := newTestManager(t, f, VmigdOptions{DisableTLS: func() bool {
		mu.Lock()
		defer mu.Unlock()
		return disable
	}})
	dir := t.TempDir()
	files := kubevirtTargetFiles(dir, testKey, false)
	if err := m.StartTargetListener(testKey, files); err != nil {
		t.Fatal(err)
	}
	ports := m.GetTargetListenerPorts(testKey)
	mu.Lock()
	disable = false
	mu.Unlock()
	// same arguments: the key keeps the setting it was made with, as the stock proxy's does
	if err := m.StartTargetListener(testKey, files); err != nil {
		t.Fatal(err)
	}
	reqs := f.requests("target-start")
	if reqs[0]["tls"] != false || reqs[1]["tls"] != false {
		t.Errorf("tls %v then %v, want false twice", reqs[0]["tls"], reqs[1]["tls"])
	}
	if !reflect.DeepEqual(m.GetTargetListenerPorts(testKey), ports) {
		t.Error("ports moved on a repeated start")
	}
	// a new key reads the setting now
	if err := m.StartTargetListener("k2", kubevirtTargetFiles(dir, "k2", false)); err != nil {
		t.Fatal(err)
	}
	if r := f.requests("target-start")[2]; r["tls"] != true {
		t.Errorf("new key: tls %v, want true", r["tls"])
	}
	// sources the same way
	pm := map[string]int{"40001": 49152}
	mu.Lock()
	disable = true
	mu.Unlock()
	if err := m.StartSourceListener(testKey, "198.18.0.2", pm, dir); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	disable = false
	mu.Unlock()
	if err := m.StartSourceListener(testKey, "198.18.0.2", pm, dir); err != nil {
		t.Fatal(err)
	}
	if err := m.StartSourceListener(testKey, "198.18.0.3", pm, dir); err != nil {
		t.Fatal(err)
	}
	reqs = f.requests("source-start")
	if reqs[0]["tls"] != false || reqs[1]["tls"] != false || reqs[2]["tls"] != true {
		t.Errorf("source tls %v %v %v, want false false true", reqs[0]["tls"], reqs[1]["tls"], reqs[2]["tls"])
	}
}

// migrations.bandwidthPerMigration becomes each source's cap: read when a key's sockets are made,
// kept by a repeated start with the same arguments, sent again after a vmigd restart and kept by
// a virt-handler that adopts the key; 0, none given, or more than vmigd takes send no cap.
func TestBandwidthPerMigration(t *testing.T) {
	f := newFakeVmigd(t)
	var mu sync.Mutex
	bw := uint64(64 << 20) // "64Mi"
	setBW := func(v uint64) {
		mu.Lock()
		bw = v
		mu.Unlock()
	}
	m := newTestManager(t, f, VmigdOptions{BandwidthPerMigration: func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return bw
	}})
	dir := t.TempDir()
	pm := map[string]int{"40001": 49152, "40002": 0}
	last := func() map[string]interface{} {
		reqs := f.requests("source-start")
		return reqs[len(reqs)-1]
	}
	capOf := func(r map[string]interface{}) interface{} {
		v, ok := r["bandwidth"]
		if !ok {
			return "none"
		}
		return v
	}

	if err := m.StartSourceListener(testKey, "198.18.0.2", pm, dir); err != nil {
		t.Fatal(err)
	}
	if c := capOf(last()); c != float64(64<<20) {
		t.Errorf("first start: bandwidth %v, want %d", c, 64<<20)
	}
	files := m.GetSourceListenerFiles(testKey)
	// the cluster's value changes: the key keeps its cap, so vmigd keeps its sockets
	setBW(0)
	if err := m.StartSourceListener(testKey, "198.18.0.2", pm, dir); err != nil {
		t.Fatal(err)
	}
	if c := capOf(last()); c != float64(64<<20) {
		t.Errorf("repeated start: bandwidth %v, want the key's %d", c, 64<<20)
	}
	if !reflect.DeepEqual(m.GetSourceListenerFiles(testKey), files) {
		t.Error("a repeated start moved the sockets")
	}
	// a new key reads the value now: 0 sends no cap
	if err := m.StartSourceListener("k2", "198.18.0.3", pm, dir); err != nil {
		t.Fatal(err)
	}
	if c := capOf(last()); c != "none" {
		t.Errorf("bandwidthPerMigration 0: bandwidth %v, want none", c)
	}
	setBW(vmigdMaxRate + 1)
	if err := m.StartSourceListener("k3", "198.18.0.3", pm, dir); err != nil {
		t.Fatal(err)
	}
	if c := capOf(last()); c != "none" {
		t.Errorf("over vmigd's largest rate: bandwidth %v, want none", c)
	}
	setBW(1000)
	if err := m.StartSourceListener("k3", "198.18.0.4", pm, dir); err != nil {
		t.Fatal(err)
	}
	if c := capOf(last()); c != float64(1000) {
		t.Errorf("new arguments: bandwidth %v, want 1000 (read again)", c)
	}
	for _, r := range f.requests("target-start") {
		if _, ok := r["bandwidth"]; ok {
			t.Errorf("target-start carries a cap: %v", r)
		}
	}

	// vmigd restarts: the sources are made again with their own caps
	setBW(5)
	before := len(f.requests("source-start"))
	f.restart()
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	got := map[string]interface{}{}
	for _, r := range f.requests("source-start")[before:] {
		got[r["key"].(string)] = capOf(r)
	}
	want := map[string]interface{}{testKey: float64(64 << 20), "k2": "none", "k3": float64(1000)}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("after vmigd's restart: caps %v, want %v", got, want)
	}

	// virt-handler restarts: the adopted key's cap is vmigd's, kept by a repeated start
	m.Close()
	m2 := newTestManager(t, f, VmigdOptions{BandwidthPerMigration: func() uint64 { return 7 }})
	if err := m2.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := m2.StartSourceListener(testKey, "198.18.0.2", pm, dir); err != nil {
		t.Fatal(err)
	}
	if c := capOf(last()); c != float64(64<<20) {
		t.Errorf("repeated start of an adopted key: bandwidth %v, want %d", c, 64<<20)
	}

	// no option at all: no cap
	m3 := newTestManager(t, f, VmigdOptions{})
	if err := m3.StartSourceListener("k4", "198.18.0.2", pm, dir); err != nil {
		t.Fatal(err)
	}
	if c := capOf(last()); c != "none" {
		t.Errorf("no BandwidthPerMigration: bandwidth %v, want none", c)
	}
}

func TestErrorsCarryVmigdMessage(t *testing.T) {
	f := newFakeVmigd(t)
	m := newTestManager(t, f, VmigdOptions{})
	msg := "socket /b/migrationproxy/k-source.sock is served by migration k2 (port 0)"
	f.mu.Lock()
	f.refuse["source-start"] = [2]string{"EEXIST", msg}
	f.mu.Unlock()
	err := m.StartSourceListener("k", "198.18.0.2", map[string]int{"1": 0}, "/b")
	var ve *VmigdError
	if !errors.As(err, &ve) || ve.Code != "EEXIST" || ve.Msg != msg {
		t.Fatalf("error %#v", err)
	}
	if !strings.Contains(err.Error(), msg) || !strings.Contains(err.Error(), "source-start k") {
		t.Errorf("error text %q", err.Error())
	}
	if m.OpenListenerCount() != 0 {
		t.Error("a refused start is in the cache")
	}
	// vmigd down: the error says where it looked
	f.down()
	err = m.StartTargetListener("k", []string{"/x/k-49152-source.sock"})
	if err == nil || !strings.Contains(err.Error(), f.path) {
		t.Errorf("vmigd down: %v", err)
	}
}

func TestDuplicateLogicalPort(t *testing.T) {
	f := newFakeVmigd(t)
	m := newTestManager(t, f, VmigdOptions{})
	err := m.StartTargetListener("k", []string{"/a/virtqemud-sock", "/b/other-sock"})
	var ve *VmigdError
	if !errors.As(err, &ve) || ve.Code != "EINVAL" {
		t.Fatalf("two files on logical port 0: %v", err)
	}
	if len(f.requests("target-start")) != 0 {
		t.Error("sent anyway")
	}
}

func TestVmigdWithoutKubevirtMode(t *testing.T) {
	f := newFakeVmigd(t)
	f.ownForm = true
	m := newTestManager(t, f, VmigdOptions{})
	err := m.StartTargetListener(testKey, kubevirtTargetFiles(t.TempDir(), testKey, false))
	if err == nil || !strings.Contains(err.Error(), "KubeVirt mode") {
		t.Fatalf("own-form reply: %v", err)
	}
	if len(m.GetTargetListenerPorts(testKey)) != 0 {
		t.Error("cached")
	}
}

// A wedged vmigd must not wedge virt-handler: starts fail after the timeout, Get* answer at once.
func TestWedgedVmigd(t *testing.T) {
	f := newFakeVmigd(t)
	m := newTestManager(t, f, VmigdOptions{Timeout: 300 * time.Millisecond})
	if err := m.StartTargetListener("ready", kubevirtTargetFiles(t.TempDir(), "ready", false)); err != nil {
		t.Fatal(err)
	}
	f.wedge()
	done := make(chan error, 1)
	t0 := time.Now()
	go func() { done <- m.StartTargetListener(testKey, kubevirtTargetFiles(t.TempDir(), testKey, false)) }()
	time.Sleep(50 * time.Millisecond)
	t1 := time.Now()
	if len(m.GetTargetListenerPorts("ready")) != 2 || m.OpenListenerCount() != 1 {
		t.Error("cache")
	}
	if d := time.Since(t1); d > 20*time.Millisecond {
		t.Errorf("GetTargetListenerPorts took %s while a start waited on vmigd", d)
	}
	err := <-done
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("start took %s with a 300 ms timeout", d)
	}
	if err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Errorf("wedged: %v", err)
	}
	// a stop without an answer is retried once vmigd answers again
	m.StopTargetListener("ready")
	if m.OpenListenerCount() != 0 {
		t.Error("stopped key still counted")
	}
	f.unwedge()
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	if f.has("target", "ready") {
		t.Error("the stop was not retried")
	}
}

// vmigd restarted under a running manager: every listener is made again; targets on the ports
// published for them.
func TestVmigdRestart(t *testing.T) {
	f := newFakeVmigd(t)
	m := newTestManager(t, f, VmigdOptions{})
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "kubevirt", "migrationproxy"), 0o755)
	if err := m.StartTargetListener("t1", kubevirtTargetFiles(dir, "t1", true)); err != nil {
		t.Fatal(err)
	}
	if err := m.StartSourceListener("s1", "198.18.0.2", map[string]int{"40101": 49152, "40102": 0},
		filepath.Join(dir, "kubevirt")); err != nil {
		t.Fatal(err)
	}
	oldPorts := m.GetTargetListenerPorts("t1")
	oldFiles := m.GetSourceListenerFiles("s1")

	f.restart()
	// the next start notices (the socket is a new inode) before its own request
	if err := m.StartTargetListener("t2", kubevirtTargetFiles(dir, "t2", false)); err != nil {
		t.Fatal(err)
	}
	if !f.has("target", "t1") || !f.has("source", "s1") || !f.has("target", "t2") {
		t.Fatalf("after restart vmigd lacks a listener set")
	}
	newPorts := m.GetTargetListenerPorts("t1")
	if !reflect.DeepEqual(logicals(newPorts), []int{0, 49152, 49153}) || !reflect.DeepEqual(newPorts, oldPorts) {
		t.Errorf("t1 ports %v, were %v", newPorts, oldPorts)
	}
	f.mu.Lock()
	vmigdPorts := f.targets["t1"].ports
	f.mu.Unlock()
	if !reflect.DeepEqual(vmigdPorts, oldPorts) {
		t.Errorf("the new vmigd listens for t1 on %v, published %v", vmigdPorts, oldPorts)
	}
	if !reflect.DeepEqual(m.GetSourceListenerFiles("s1"), oldFiles) {
		t.Errorf("s1 files %v, were %v", m.GetSourceListenerFiles("s1"), oldFiles)
	}
	if c := m.OpenListenerCount(); c != 3 {
		t.Errorf("count %d", c)
	}

}

// logLines collects what a manager logs.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(t *testing.T) func(string, ...interface{}) {
	return func(format string, args ...interface{}) {
		line := fmt.Sprintf(format, args...)
		t.Log(line)
		l.mu.Lock()
		l.lines = append(l.lines, line)
		l.mu.Unlock()
	}
}

func (l *logLines) find(sub ...string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
next:
	for _, line := range l.lines {
		for _, s := range sub {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		return line
	}
	return ""
}

// After a restart the target's listeners are asked for on the ports published for it ("listen":
// logical -> TCP); one taken meanwhile: the error is logged with the key and the ports, and the
// target is made on new ports, still held.
func TestVmigdRestartRebindsTargetPorts(t *testing.T) {
	f := newFakeVmigd(t)
	var logs logLines
	m := newTestManager(t, f, VmigdOptions{})
	m.opts.Infof, m.opts.Warningf = logs.add(t), logs.add(t)
	dir := t.TempDir()
	for _, key := range []string{"t1", "t2"} {
		if err := m.StartTargetListener(key, kubevirtTargetFiles(dir, key, false)); err != nil {
			t.Fatal(err)
		}
	}
	p1, p2 := m.GetTargetListenerPorts("t1"), m.GetTargetListenerPorts("t2")
	var busy int
	for tcp := range p2 {
		busy, _ = strconv.Atoi(tcp)
	}
	f.restart()
	f.mu.Lock()
	f.taken[busy] = true // another process bound one of t2's ports while vmigd was down
	f.mu.Unlock()
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	starts := f.requests("target-start")
	var asked []interface{}
	for _, r := range starts[2:] {
		if r["key"] == "t1" {
			asked = append(asked, r["listen"])
		}
	}
	want := map[string]interface{}{}
	for tcp, l := range p1 {
		n, _ := strconv.Atoi(tcp)
		want[strconv.Itoa(l)] = float64(n)
	}
	if len(asked) != 1 || !reflect.DeepEqual(asked[0], want) {
		t.Errorf("t1 made again with listen %v, want %v", asked, want)
	}
	if got := m.GetTargetListenerPorts("t1"); !reflect.DeepEqual(got, p1) {
		t.Errorf("t1 ports %v after the restart, were %v", got, p1)
	}
	if logs.find("t1", "listens again on its published ports", vmigdPortsString(p1)) == "" {
		t.Error("no line says t1 listens again on its published ports")
	}
	got := m.GetTargetListenerPorts("t2")
	if !f.has("target", "t2") || len(got) != len(p2) || reflect.DeepEqual(got, p2) {
		t.Errorf("t2: held %v, ports %v, were %v", f.has("target", "t2"), got, p2)
	}
	if logs.find("error:", "t2", vmigdPortsString(p2), "EADDRINUSE") == "" {
		t.Error("no error line names t2, its published ports and EADDRINUSE")
	}
	if c := m.OpenListenerCount(); c != 2 {
		t.Errorf("count %d", c)
	}
}

// A vmigd that took over from a running one: what the older one kept stays there, on its ports,
// and is not asked of the new one.
func TestTakeoverKeptTargetStays(t *testing.T) {
	f := newFakeVmigd(t)
	m := newTestManager(t, f, VmigdOptions{})
	dir := t.TempDir()
	if err := m.StartTargetListener("t1", kubevirtTargetFiles(dir, "t1", false)); err != nil {
		t.Fatal(err)
	}
	p1 := m.GetTargetListenerPorts("t1")
	f.restart()
	f.mu.Lock()
	f.takeover = map[string]interface{}{"from_pid": 4000, "previous": "carrying on",
		"kept": []interface{}{map[string]interface{}{"key": "t1", "role": "target", "pid": 4000}}}
	f.mu.Unlock()
	n := len(f.requests("target-start"))
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	if len(f.requests("target-start")) != n {
		t.Error("a target the older vmigd kept was asked of the new one")
	}
	if got := m.GetTargetListenerPorts("t1"); !reflect.DeepEqual(got, p1) {
		t.Errorf("t1 ports %v, were %v", got, p1)
	}
}

// The background resync notices a restart with no call at all.
func TestVmigdRestartNoticedInBackground(t *testing.T) {
	f := newFakeVmigd(t)
	m := newTestManager(t, f, VmigdOptions{ResyncInterval: 50 * time.Millisecond})
	dir := t.TempDir()
	if err := m.StartTargetListener("t1", kubevirtTargetFiles(dir, "t1", false)); err != nil {
		t.Fatal(err)
	}
	if err := m.StartSourceListener("s1", "198.18.0.2", map[string]int{"40101": 49152}, dir); err != nil {
		t.Fatal(err)
	}
	f.restart()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && f.count() != 2 {
		time.Sleep(20 * time.Millisecond)
	}
	if n := f.count(); n != 2 {
		t.Errorf("background resync made %d of 2 again", n)
	}
}

// A source whose virt-launcher went away while vmigd was down cannot be made again: dropped.
func TestVmigdRestartDropsWhatCannotBeMade(t *testing.T) {
	f := newFakeVmigd(t)
	m := newTestManager(t, f, VmigdOptions{})
	if err := m.StartSourceListener("s1", "198.18.0.2", map[string]int{"40101": 49152}, "/gone"); err != nil {
		t.Fatal(err)
	}
	f.restart()
	f.mu.Lock()
	f.refuse["source-start"] = [2]string{"ENOENT", "source-start s1: /gone: No such file or directory"}
	f.mu.Unlock()
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	if m.OpenListenerCount() != 0 {
		t.Error("kept a source vmigd refused to make again")
	}
}

// A new manager (virt-handler restarted, vmigd kept running) adopts what vmigd carries, and
// stops what belongs to a virt-launcher that is gone.
func TestAdoptFromRunningVmigd(t *testing.T) {
	f := newFakeVmigd(t)
	live := t.TempDir()
	os.MkdirAll(filepath.Join(live, "libvirt"), 0o755)
	os.MkdirAll(filepath.Join(live, "kubevirt", "migrationproxy"), 0o755)
	old := newTestManager(t, f, VmigdOptions{})
	if err := old.StartTargetListener("t1", kubevirtTargetFiles(live, "t1", false)); err != nil {
		t.Fatal(err)
	}
	if err := old.StartSourceListener("s1", "198.18.0.2", map[string]int{"40101": 49152, "40102": 0},
		filepath.Join(live, "kubevirt")); err != nil {
		t.Fatal(err)
	}
	if err := old.StartTargetListener("gone", kubevirtTargetFiles("/nonexistent/launcher", "gone", false)); err != nil {
		t.Fatal(err)
	}
	ports := old.GetTargetListenerPorts("t1")
	files := old.GetSourceListenerFiles("s1")
	old.Close()

	m := newTestManager(t, f, VmigdOptions{})
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := m.GetTargetListenerPorts("t1"); !reflect.DeepEqual(got, ports) {
		t.Errorf("adopted ports %v, want %v", got, ports)
	}
	got := m.GetSourceListenerFiles("s1")
	sort.Strings(got)
	sort.Strings(files)
	if !reflect.DeepEqual(got, files) {
		t.Errorf("adopted files %v, want %v", got, files)
	}
	if m.OpenListenerCount() != 2 {
		t.Errorf("count %d, want 2", m.OpenListenerCount())
	}
	if f.has("target", "gone") {
		t.Error("the entry of a gone launcher was not stopped")
	}
	// the adopted source's arguments are known: a repeated start keeps its TLS setting
	m.opts.DisableTLS = func() bool { return true }
	if err := m.StartSourceListener("s1", "198.18.0.2", map[string]int{"40101": 49152, "40102": 0},
		filepath.Join(live, "kubevirt")); err != nil {
		t.Fatal(err)
	}
	reqs := f.requests("source-start")
	if r := reqs[len(reqs)-1]; r["tls"] != true {
		t.Errorf("repeated start of an adopted key: tls %v", r["tls"])
	}
}

// Each patch of ../patches carries this package's vmigd.go as KubeVirt's vmigd-proxy.go: they
// must not drift apart. After a change here: contrib/kubevirt/make-patch --all. (make-patch
// --check-only, the kubevirt_patch test, compares the whole patches.)
func TestPatchVendorsThisFile(t *testing.T) {
	patches, err := filepath.Glob("../patches/virt-handler-*.patch")
	if err != nil || len(patches) == 0 {
		t.Fatalf("no ../patches/virt-handler-*.patch (%v)", err)
	}
	src, err := os.ReadFile("vmigd.go")
	if err != nil {
		t.Fatal(err)
	}
	afterImports := func(s string) string {
		i := strings.Index(s, "\nimport (\n")
		if i < 0 {
			return ""
		}
		j := strings.Index(s[i:], "\n)\n")
		return s[i+j+3:]
	}
	body := afterImports(string(src))
	for _, name := range patches {
		patch, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		var vendored strings.Builder
		in := false
		for _, line := range strings.Split(string(patch), "\n") {
			switch {
			case strings.HasPrefix(line, "+++ "):
				in = line == "+++ b/pkg/virt-handler/migration-proxy/vmigd-proxy.go"
			case in && strings.HasPrefix(line, "+"):
				vendored.WriteString(line[1:] + "\n")
			}
		}
		if body == "" || !strings.Contains(afterImports(vendored.String()), body) {
			t.Errorf("%s does not carry this vmigd.go: run contrib/kubevirt/make-patch --all", name)
		}
	}
}

// list's peer: the address alone in KubeVirt mode, ADDR:PORT in vmigd's own form.
func TestListPeerAddress(t *testing.T) {
	for peer, want := range map[string]string{"198.18.0.2": "198.18.0.2", "fd00::2": "fd00::2",
		"[fd00::2]": "fd00::2", "[fd00::2]:40001": "fd00::2", "198.18.0.2:40001": "198.18.0.2"} {
		mig := vmigdMigration{Key: "k", Role: "source", Kubevirt: true, Peer: peer}
		if got := mig.source().address; got != want {
			t.Errorf("peer %q: address %q, want %q", peer, got, want)
		}
	}
	if s := (&vmigdMigration{}).source(); !s.partial {
		t.Error("no peer, yet not partial")
	}
}
