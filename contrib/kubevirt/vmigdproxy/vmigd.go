// SPDX-License-Identifier: Apache-2.0
// KubeVirt's ProxyManager on top of vmigd: each Start/Stop becomes one request on vmigd's control
// socket (doc/interfaces.md, "Control protocol"), and vmigd carries the bytes. Not a data path and
// no migration policy: idempotency is vmigd's; this file keeps a cache so that what virt-handler
// asks on every reconcile never waits on a socket.
//
// Standard library only and free of this package's other files' names, so that it can be copied
// into kubevirt/pkg/virt-handler/migration-proxy/ with only its package line changed
// (contrib/kubevirt/make-patch does that); hence the Vmigd prefix on every name.

package vmigdproxy

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// A control request is answered by vmigd's control thread without blocking work (a start
	// creates listeners and sockets, a stop closes them), in milliseconds. Five seconds without an
	// answer means vmigd is wedged: the call fails, virt-handler requeues the VMI with its backoff,
	// and the controller's worker is free again. Never unbounded: the stock proxy cannot wedge.
	vmigdDefaultTimeout = 5 * time.Second
	// How often vmigd's status is read to notice that it restarted with no call in between.
	vmigdDefaultResync = 10 * time.Second
	// The first contact is retried this often until vmigd answers (it may start after us).
	vmigdFirstSyncRetry = time.Second
	// list and status replies grow with migrations and connections; this bounds what we read.
	vmigdMaxReply = 32 << 20

	vmigdShutdownError = "unable to process new migration connections during virt-handler shutdown"

	// vmigd's largest cap, bytes/s (doc/control-protocol.md); a larger one is beyond any link and
	// is sent as none.
	vmigdMaxRate = 1000000000000000
)

// VmigdControlEnv is the environment variable that selects vmigd in the patched virt-handler: set
// on its container to vmigd's control socket. A stock virt-handler ignores it and keeps its
// built-in proxy.
const VmigdControlEnv = "VMIGD_CONTROL"

// VmigdOptions configures a VmigdProxyManager.
type VmigdOptions struct {
	// ControlSocket is vmigd's --control path, e.g. /var/run/kubevirt/daemons/vmigd/control.sock.
	ControlSocket string
	// DisableTLS is read whenever listeners are created for a key, as KubeVirt reads the
	// cluster's migrations.disableTLS when it creates each listener (migration-proxy.go:172-175,
	// :297-300). A repeated start with the same arguments keeps the key's setting, as the stock
	// proxy does. nil: TLS on.
	DisableTLS func() bool
	// BandwidthPerMigration is the cap in bytes/s each source migration starts with: KubeVirt's
	// migrations.bandwidthPerMigration from the live cluster config. Like DisableTLS it is read
	// when a key's source sockets are made, and a repeated start with the same arguments keeps the
	// key's cap (vmigd would remake the sockets for another). vmigd holds it on the wire over all
	// the migration's connections together. nil or 0: no cap.
	BandwidthPerMigration func() uint64
	// Timeout bounds one control request: connect, write and reply together. 0: 5 s.
	Timeout time.Duration
	// ResyncInterval is how often vmigd's status is read in the background to notice a restart.
	// 0: 10 s. Negative: no background goroutine; restarts are then noticed at the next start.
	ResyncInterval time.Duration
	// Infof and Warningf receive the manager's log lines; nil discards them.
	Infof    func(format string, args ...interface{})
	Warningf func(format string, args ...interface{})
}

// VmigdError is a failed control request. Code is vmigd's errno name (ENOENT, EEXIST, EINVAL,
// ESHUTDOWN, ...) and Msg its one line; when no reply came, Code is empty and Err says why.
type VmigdError struct {
	Op   string
	Key  string
	Code string
	Msg  string
	Err  error
}

func (e *VmigdError) Error() string {
	what := "vmigd " + e.Op
	if e.Key != "" {
		what += " " + e.Key
	}
	if e.Err != nil {
		return what + ": " + e.Err.Error()
	}
	if e.Code != "" && !strings.HasSuffix(e.Msg, "("+e.Code+")") {
		return what + ": " + e.Msg + " (" + e.Code + ")"
	}
	return what + ": " + e.Msg
}

func (e *VmigdError) Unwrap() error { return e.Err }

// vmigdTarget is what the cache knows of one key's target listeners.
type vmigdTarget struct {
	sockets map[string]string // logical port (decimal) -> unix path, as sent
	tls     bool
	ports   map[string]int // TCP port (decimal) -> logical port, vmigd's answer
	partial bool           // adopted from a list that did not say everything
}

// vmigdSource is what the cache knows of one key's source sockets.
type vmigdSource struct {
	address   string
	portMap   map[string]int // TCP port on the target -> logical port
	baseDir   string
	tls       bool
	bandwidth uint64 // bytes/s; 0: no cap
	files     []string
	partial   bool
}

type vmigdKeyLock struct {
	mu   sync.Mutex
	refs int
}

// vmigdSocketID tells one control socket from the next: a restarted vmigd binds a new one, and
// a file system may give it the old inode number (ext4 does), but not the old change time.
type vmigdSocketID struct {
	dev, ino       uint64
	ctimeS, ctimeN int64
}

// VmigdProxyManager implements KubeVirt's ProxyManager with vmigd. Safe for concurrent use.
//
// Locks: mu guards the maps and flags and is never held across socket I/O, so Get* and
// OpenListenerCount never wait on vmigd. Each (role, key) has its own lock held across its
// request, so calls for one key are ordered and calls for other keys are not held up by them.
// syncMu makes one Sync at a time; Sync takes key locks, a key's holder never calls Sync.
type VmigdProxyManager struct {
	opts VmigdOptions

	mu           sync.Mutex
	targets      map[string]*vmigdTarget
	sources      map[string]*vmigdSource
	shuttingDown bool
	pid          int           // vmigd's pid at the last Sync; 0 before the first
	sockID       vmigdSocketID // the control socket's identity at the last Sync
	adopting     bool          // the first Sync's list is in flight
	touched      map[string]bool
	pendingStops map[string]bool // "role/key" whose stop got no answer: retried by Sync
	keyLocks     map[string]*vmigdKeyLock

	syncMu    sync.Mutex
	stopLoop  chan struct{}
	loopDone  chan struct{}
	closeOnce sync.Once
}

var _ ProxyManager = (*VmigdProxyManager)(nil)

// NewVmigdProxyManager returns a manager for the vmigd at opts.ControlSocket. It does not wait
// for vmigd: the first Sync runs in the background (or at the first start), adopting what vmigd
// already carries for KubeVirt, so that a restarted virt-handler sees the migrations a running
// vmigd kept.
func NewVmigdProxyManager(opts VmigdOptions) *VmigdProxyManager {
	if opts.Timeout <= 0 {
		opts.Timeout = vmigdDefaultTimeout
	}
	if opts.ResyncInterval == 0 {
		opts.ResyncInterval = vmigdDefaultResync
	}
	m := &VmigdProxyManager{
		opts:         opts,
		targets:      make(map[string]*vmigdTarget),
		sources:      make(map[string]*vmigdSource),
		touched:      make(map[string]bool),
		pendingStops: make(map[string]bool),
		keyLocks:     make(map[string]*vmigdKeyLock),
		stopLoop:     make(chan struct{}),
		loopDone:     make(chan struct{}),
	}
	if opts.ResyncInterval > 0 {
		go m.loop()
	} else {
		close(m.loopDone)
	}
	return m
}

// Close stops the background resync. The listeners stay with vmigd.
func (m *VmigdProxyManager) Close() {
	m.closeOnce.Do(func() { close(m.stopLoop) })
	<-m.loopDone
}

func (m *VmigdProxyManager) infof(format string, args ...interface{}) {
	if m.opts.Infof != nil {
		m.opts.Infof(format, args...)
	}
}

func (m *VmigdProxyManager) warningf(format string, args ...interface{}) {
	if m.opts.Warningf != nil {
		m.opts.Warningf(format, args...)
	}
}

// ---- ProxyManager ----

// StartTargetListener asks vmigd for one TCP listener per unix file, KubeVirt's way: each file's
// logical port by KubeVirt's substring rule (ConstructProxyKey(key, 49152|49153) in the path,
// else 0). The same files again change nothing; other files replace the key's listeners.
func (m *VmigdProxyManager) StartTargetListener(key string, targetUnixFiles []string) error {
	if m.isShuttingDown() {
		return errors.New(vmigdShutdownError)
	}
	sockets := make(map[string]string, len(targetUnixFiles))
	for _, f := range targetUnixFiles {
		port := strconv.Itoa(vmigdLogicalPort(key, f))
		if other, dup := sockets[port]; dup {
			return &VmigdError{Op: "target-start", Key: key, Code: "EINVAL",
				Msg: fmt.Sprintf("%s and %s both map to logical port %s", other, f, port)}
		}
		sockets[port] = f
	}
	if err := m.checkDaemon("target-start", key); err != nil {
		return err
	}

	unlock := m.lockKey("target/" + key)
	defer unlock()
	tls := m.tlsFor(func() (bool, bool) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if t := m.targets[key]; t != nil && vmigdSameStrings(t.sockets, sockets) {
			return t.tls, true
		}
		return false, false
	})
	ports, err := m.targetStart(key, sockets, tls, nil)
	if err != nil {
		m.afterFailedStart("target", key, err)
		return err
	}
	m.mu.Lock()
	m.targets[key] = &vmigdTarget{sockets: sockets, tls: tls, ports: ports}
	m.touch("target/" + key)
	m.mu.Unlock()
	return nil
}

// GetTargetListenerPorts answers from the cache: {"<tcp port>": logical port}, empty for an
// unknown key. virt-handler calls it on every reconcile.
func (m *VmigdProxyManager) GetTargetListenerPorts(key string) map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	ports := make(map[string]int)
	if t := m.targets[key]; t != nil {
		for k, v := range t.ports {
			ports[k] = v
		}
	}
	return ports
}

// StopTargetListener stops the key's listeners; an unknown key is not an error.
func (m *VmigdProxyManager) StopTargetListener(key string) {
	m.stopKey("target", key)
}

// StartSourceListener asks vmigd for KubeVirt's unix sockets under baseDir/migrationproxy/, one
// per entry of destSrcPortMap ({"<tcp port on the target>": logical port}), each relaying to
// targetAddress at that port. The same address, ports and directory again change nothing; others
// replace the key's sockets.
func (m *VmigdProxyManager) StartSourceListener(key string, targetAddress string, destSrcPortMap map[string]int, baseDir string) error {
	if m.isShuttingDown() {
		return errors.New(vmigdShutdownError)
	}
	if err := m.checkDaemon("source-start", key); err != nil {
		return err
	}

	unlock := m.lockKey("source/" + key)
	defer unlock()
	want := &vmigdSource{address: targetAddress, portMap: vmigdCopyPorts(destSrcPortMap),
		baseDir: baseDir}
	m.mu.Lock()
	known := m.sources[key]
	if known != nil && known.sameArgs(want) {
		want.tls, want.bandwidth = known.tls, known.bandwidth
	} else {
		known = nil
	}
	m.mu.Unlock()
	if known == nil {
		want.tls = m.tlsNow()
		want.bandwidth = m.bandwidthNow()
	}
	files, err := m.sourceStart(key, want)
	if err != nil {
		m.afterFailedStart("source", key, err)
		return err
	}
	want.files = files
	m.mu.Lock()
	m.sources[key] = want
	m.touch("source/" + key)
	m.mu.Unlock()
	return nil
}

// GetSourceListenerFiles answers from the cache: the key's unix socket paths.
func (m *VmigdProxyManager) GetSourceListenerFiles(key string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	files := []string{}
	if s := m.sources[key]; s != nil {
		files = append(files, s.files...)
	}
	return files
}

// StopSourceListener stops the key's sockets (vmigd removes the files); an unknown key is not an
// error.
func (m *VmigdProxyManager) StopSourceListener(key string) {
	m.stopKey("source", key)
}

// OpenListenerCount is the number of source keys plus target keys, as the stock proxy counts.
// virt-handler's shutdown waits for it to reach 0. Once shutting down, a vmigd that is gone (its
// socket missing or refusing) counts as 0: its listeners went with it, there is nothing to wait
// for. A vmigd that does not answer in time is not gone.
func (m *VmigdProxyManager) OpenListenerCount() int {
	m.mu.Lock()
	n := len(m.sources) + len(m.targets)
	shutting := m.shuttingDown
	m.mu.Unlock()
	if !shutting || n == 0 {
		return n
	}
	if err := m.call("status", "", map[string]interface{}{"op": "status"}, nil); err != nil && vmigdGone(err) {
		m.mu.Lock()
		m.infof("vmigd is gone (%v): its %d migration listener sets went with it", err,
			len(m.sources)+len(m.targets))
		m.sources = make(map[string]*vmigdSource)
		m.targets = make(map[string]*vmigdTarget)
		m.mu.Unlock()
		return 0
	}
	return n
}

// InitiateGracefulShutdown makes later starts fail, as the stock proxy's does. vmigd is not told:
// it drains on its own SIGTERM (--drain-timeout).
func (m *VmigdProxyManager) InitiateGracefulShutdown() {
	m.mu.Lock()
	m.shuttingDown = true
	m.mu.Unlock()
}

// ---- resync ----

// Sync reads vmigd's status. The first time, it also adopts what vmigd carries for KubeVirt (a
// restarted virt-handler). When vmigd's pid changed, vmigd restarted and lost every listener: the
// cached ones are made again (see restarted). Otherwise it retries stops that got no answer.
func (m *VmigdProxyManager) Sync() error {
	m.syncMu.Lock()
	defer m.syncMu.Unlock()

	id, _ := m.socketID()
	var st struct {
		Status struct {
			Pid      int            `json:"pid"`
			Takeover *vmigdTakeover `json:"takeover"`
		} `json:"status"`
	}
	if err := m.call("status", "", map[string]interface{}{"op": "status"}, &st); err != nil {
		return err
	}
	if st.Status.Pid <= 0 {
		return &VmigdError{Op: "status", Msg: "the reply has no pid"}
	}
	m.mu.Lock()
	prev := m.pid
	m.pid, m.sockID = st.Status.Pid, id
	m.mu.Unlock()

	switch {
	case prev == 0:
		return m.adopt()
	case prev != st.Status.Pid:
		m.restarted(prev, st.Status.Pid, st.Status.Takeover.keptNames())
		return nil
	default:
		m.retryStops()
		return nil
	}
}

func (m *VmigdProxyManager) loop() {
	defer close(m.loopDone)
	failing := false
	for {
		wait := m.opts.ResyncInterval
		if err := m.Sync(); err != nil {
			m.mu.Lock()
			if m.pid == 0 && wait > vmigdFirstSyncRetry {
				wait = vmigdFirstSyncRetry
			}
			m.mu.Unlock()
			if !failing {
				m.warningf("vmigd: %v (retrying every %s)", err, wait)
			}
			failing = true
		} else if failing {
			m.infof("vmigd answers again")
			failing = false
		}
		select {
		case <-m.stopLoop:
			return
		case <-time.After(wait):
		}
	}
}

// checkDaemon runs a Sync before a start when vmigd was never reached, or when its control
// socket is not the one of the last Sync (a new vmigd makes a new socket). A stat, no
// request, when nothing changed. It returns the Sync's error only when vmigd did not answer
// (the start would wait for nothing); a refusal shows again in the start's own request.
func (m *VmigdProxyManager) checkDaemon(op, key string) error {
	id, err := m.socketID()
	if err != nil {
		return nil // the request that follows says why
	}
	m.mu.Lock()
	fresh := m.pid != 0 && id == m.sockID
	m.mu.Unlock()
	if fresh {
		return nil
	}
	err = m.Sync()
	var ve *VmigdError
	if errors.As(err, &ve) && ve.Err != nil {
		return &VmigdError{Op: op, Key: key, Err: ve.Err}
	}
	return nil
}

func (m *VmigdProxyManager) socketID() (vmigdSocketID, error) {
	fi, err := os.Stat(m.opts.ControlSocket)
	if err != nil {
		return vmigdSocketID{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return vmigdSocketID{}, errors.New("no inode")
	}
	return vmigdSocketID{dev: uint64(st.Dev), ino: uint64(st.Ino),
		ctimeS: int64(st.Ctim.Sec), ctimeN: int64(st.Ctim.Nsec)}, nil
}

// adopt fills the cache from vmigd's list: the migrations it carries in KubeVirt mode. A key that
// a call changed while the list was in flight keeps what that call left. An entry whose unix
// sockets' directories are all gone belongs to a virt-launcher that is gone: it is stopped, not
// adopted (nothing would ever stop it, and the shutdown would wait for it).
func (m *VmigdProxyManager) adopt() error {
	m.mu.Lock()
	m.adopting = true
	m.touched = make(map[string]bool)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.adopting = false
		m.touched = make(map[string]bool)
		m.mu.Unlock()
	}()

	list, err := m.list()
	if err != nil {
		m.mu.Lock()
		m.pid = 0 // adopt again at the next Sync
		m.mu.Unlock()
		return err
	}
	var stale []string
	nt, ns := 0, 0
	m.mu.Lock()
	for _, mig := range list {
		name := mig.Role + "/" + mig.Key
		if !mig.Kubevirt || m.touched[name] {
			continue
		}
		switch mig.Role {
		case "target":
			if m.targets[mig.Key] != nil {
				continue
			}
			t := mig.target()
			if !vmigdAnyDirExists(t.sockets) {
				stale = append(stale, name)
				continue
			}
			m.targets[mig.Key] = t
			nt++
		case "source":
			if m.sources[mig.Key] != nil {
				continue
			}
			s := mig.source()
			if s.baseDir != "" && !vmigdAnyDirExists(map[string]string{"": s.baseDir + "/"}) {
				stale = append(stale, name)
				continue
			}
			m.sources[mig.Key] = s
			ns++
		}
	}
	m.mu.Unlock()
	if nt+ns > 0 {
		m.infof("vmigd carries %d source and %d target migrations for KubeVirt: adopted", ns, nt)
	}
	for _, name := range stale {
		role, key := vmigdSplitName(name)
		m.warningf("vmigd: %s %s: its virt-launcher's directories are gone; stopping it", role, key)
		m.stopKey(role, key)
	}
	return nil
}

// vmigdTakeover is status's "takeover": this vmigd took over from an older one (vmigd
// --takeover), which still carries the migrations in kept while previous is "carrying on".
type vmigdTakeover struct {
	Previous string `json:"previous"`
	Kept     []struct {
		Key  string `json:"key"`
		Role string `json:"role"`
	} `json:"kept"`
}

// keptNames: "role/key" of what the previous vmigd still carries; nil without a takeover.
func (t *vmigdTakeover) keptNames() map[string]bool {
	if t == nil || t.Previous != "carrying on" {
		return nil
	}
	kept := make(map[string]bool, len(t.Kept))
	for _, k := range t.Kept {
		kept[k.Role+"/"+k.Key] = true
	}
	return kept
}

// restarted handles a new vmigd: it carries nothing of what the cache holds. What a KubeVirt
// operator expects is that the listeners virt-handler believes in exist, so each is made again:
//   - a source whose migration has not begun (virt-handler calls StartSourceListener until it
//     does) then proceeds, the target's ports being unchanged; one that was running has failed
//     already, and virt-handler stops it when it sees that;
//   - a target is made on the TCP ports published for it, which KubeVirt publishes once
//     (migration-target.go:385-413), so that a source that has not connected yet still reaches
//     it. If one of them was taken meanwhile, the target gets new ports and the error is logged:
//     such a source then fails fast (connection refused), and GetTargetListenerPorts answers
//     the new ports, which keeps the key "prepared".
//
// A new vmigd that took over from a running one (vmigd --takeover) has the listeners it was
// handed; what the older one kept (kept, "role/key") stays there, with its listeners, and is not
// made again. Entries that cannot be made again (their virt-launcher is gone) are dropped. During
// shutdown nothing is made again: the cache is emptied, since those listeners are gone.
func (m *VmigdProxyManager) restarted(oldPid, newPid int, kept map[string]bool) {
	m.mu.Lock()
	m.pendingStops = make(map[string]bool)
	shutting := m.shuttingDown
	var tkeys, skeys []string
	for k := range m.targets {
		tkeys = append(tkeys, k)
	}
	for k := range m.sources {
		skeys = append(skeys, k)
	}
	if shutting {
		m.targets = make(map[string]*vmigdTarget)
		m.sources = make(map[string]*vmigdSource)
	}
	m.mu.Unlock()
	sort.Strings(tkeys)
	sort.Strings(skeys)
	if shutting {
		m.warningf("vmigd restarted (pid %d, was %d) during shutdown: %d source and %d target listener sets are gone",
			newPid, oldPid, len(skeys), len(tkeys))
		return
	}
	m.warningf("vmigd restarted (pid %d, was %d): making its %d source and %d target listener sets again",
		newPid, oldPid, len(skeys), len(tkeys))

	for _, key := range skeys {
		if kept["source/"+key] {
			m.infof("vmigd: source %s stays with the vmigd this one took over from", key)
			continue
		}
		m.remakeSource(key)
	}
	for _, key := range tkeys {
		if kept["target/"+key] {
			m.infof("vmigd: target %s stays with the vmigd this one took over from, on its ports %s",
				key, vmigdPortsString(m.GetTargetListenerPorts(key)))
			continue
		}
		m.remakeTarget(key)
	}
}

func (m *VmigdProxyManager) remakeSource(key string) {
	unlock := m.lockKey("source/" + key)
	defer unlock()
	m.mu.Lock()
	s := m.sources[key]
	m.mu.Unlock()
	if s == nil {
		return // stopped meanwhile
	}
	var err error
	var files []string
	if s.partial {
		err = errors.New("the arguments it was made with are not known (adopted from an older vmigd)")
	} else {
		files, err = m.sourceStart(key, s)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sources[key] != s {
		return
	}
	if err != nil {
		delete(m.sources, key)
		m.warningf("vmigd: source %s could not be made again, dropped: %v", key, err)
		return
	}
	s2 := *s
	s2.files = files
	m.sources[key] = &s2
	m.infof("vmigd: source %s made again: %s", key, strings.Join(files, " "))
}

// remakeTarget asks the new vmigd for key's listeners on the TCP ports published for it
// (virt-handler publishes them once). If one cannot be bound (taken meanwhile), the error is
// logged with the key and ports and the listeners are made on new ports, the key still held.
func (m *VmigdProxyManager) remakeTarget(key string) {
	unlock := m.lockKey("target/" + key)
	defer unlock()
	m.mu.Lock()
	t := m.targets[key]
	m.mu.Unlock()
	if t == nil {
		return
	}
	listen := vmigdListenPorts(t.ports)
	ports, err := m.targetStart(key, t.sockets, t.tls, listen)
	var ve *VmigdError
	rebound := err == nil
	if err != nil && listen != nil && errors.As(err, &ve) && ve.Code != "" {
		m.warningf("error: vmigd: target %s cannot listen again on its published ports %s: %v; "+
			"making it on new ports: a source that has not connected yet dials the old ones and fails",
			key, vmigdPortsString(t.ports), err)
		ports, err = m.targetStart(key, t.sockets, t.tls, nil)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.targets[key] != t {
		return
	}
	if err != nil {
		delete(m.targets, key)
		m.warningf("vmigd: target %s could not be made again, dropped: %v", key, err)
		return
	}
	m.targets[key] = &vmigdTarget{sockets: t.sockets, tls: t.tls, ports: ports}
	if rebound {
		m.infof("vmigd: target %s listens again on its published ports %s", key, vmigdPortsString(ports))
		return
	}
	m.warningf("vmigd: target %s listens again on new ports %s (were %s); the ports published for it are stale",
		key, vmigdPortsString(ports), vmigdPortsString(t.ports))
}

// vmigdListenPorts turns a port map (TCP port -> logical port) into target-start's "listen"
// (logical port -> TCP port); nil for none or for a map it cannot read.
func vmigdListenPorts(ports map[string]int) map[string]int {
	if len(ports) == 0 {
		return nil
	}
	listen := make(map[string]int, len(ports))
	for tcp, l := range ports {
		n, err := strconv.Atoi(tcp)
		if err != nil || n <= 0 || n > 65535 {
			return nil
		}
		listen[strconv.Itoa(l)] = n
	}
	return listen
}

func (m *VmigdProxyManager) retryStops() {
	m.mu.Lock()
	var names []string
	for name := range m.pendingStops {
		names = append(names, name)
	}
	m.mu.Unlock()
	sort.Strings(names)
	for _, name := range names {
		role, key := vmigdSplitName(name)
		m.mu.Lock()
		again := (role == "target" && m.targets[key] != nil) || (role == "source" && m.sources[key] != nil)
		if again {
			delete(m.pendingStops, name) // started again since: the stop is moot
		}
		m.mu.Unlock()
		if !again {
			m.stopKey(role, key)
		}
	}
}

// ---- requests ----

func (m *VmigdProxyManager) isShuttingDown() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.shuttingDown
}

// tlsFor: the key's own setting when the same arguments come again (known), else the cluster's now.
func (m *VmigdProxyManager) tlsFor(cached func() (bool, bool)) bool {
	if tls, known := cached(); known {
		return tls
	}
	return m.tlsNow()
}

// tlsNow is the cluster's setting now: TLS unless migrations.disableTLS.
func (m *VmigdProxyManager) tlsNow() bool {
	return m.opts.DisableTLS == nil || !m.opts.DisableTLS()
}

// bandwidthNow is the cluster's cap per migration now, bytes/s; 0: none.
func (m *VmigdProxyManager) bandwidthNow() uint64 {
	if m.opts.BandwidthPerMigration == nil {
		return 0
	}
	if bw := m.opts.BandwidthPerMigration(); bw <= vmigdMaxRate {
		return bw
	}
	return 0
}

// touch records a change of a key while the first Sync's list is in flight. Holds mu.
func (m *VmigdProxyManager) touch(name string) {
	if m.adopting {
		m.touched[name] = true
	}
}

func (m *VmigdProxyManager) lockKey(name string) func() {
	m.mu.Lock()
	l := m.keyLocks[name]
	if l == nil {
		l = &vmigdKeyLock{}
		m.keyLocks[name] = l
	}
	l.refs++
	m.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		m.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(m.keyLocks, name)
		}
		m.mu.Unlock()
	}
}

// afterFailedStart: vmigd stops a key's old listeners before it makes new ones, so after a
// refusal what vmigd has now is read back. A request without an answer may or may not have been
// carried out, and asking again would wait as long: the key leaves the cache, virt-handler
// prepares it again, and vmigd's idempotency makes that safe. Holds the key.
func (m *VmigdProxyManager) afterFailedStart(role, key string, startErr error) {
	var list []vmigdMigration
	err := startErr
	var ve *VmigdError
	if errors.As(startErr, &ve) && ve.Err == nil {
		list, err = m.list()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.touch(role + "/" + key)
	var found *vmigdMigration
	if err == nil {
		for i := range list {
			if list[i].Role == role && list[i].Key == key && list[i].Kubevirt {
				found = &list[i]
			}
		}
	}
	if role == "target" {
		if found != nil {
			m.targets[key] = found.target()
		} else {
			delete(m.targets, key)
		}
	} else {
		if found != nil {
			m.sources[key] = found.source()
		} else {
			delete(m.sources, key)
		}
	}
}

func (m *VmigdProxyManager) stopKey(role, key string) {
	unlock := m.lockKey(role + "/" + key)
	defer unlock()
	op := role + "-stop"
	err := m.call(op, key, map[string]interface{}{"op": op, "key": key}, nil)
	var ve *VmigdError
	if errors.As(err, &ve) && ve.Code == "ENOENT" {
		err = nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	name := role + "/" + key
	if role == "target" {
		delete(m.targets, key)
	} else {
		delete(m.sources, key)
	}
	m.touch(name)
	switch {
	case err == nil:
		delete(m.pendingStops, name)
	case errors.As(err, &ve) && ve.Err != nil && !vmigdGone(err):
		// no answer: vmigd may still have them; the next Sync asks again
		m.pendingStops[name] = true
		m.warningf("%v (will retry)", err)
	default:
		delete(m.pendingStops, name)
		m.warningf("%v", err)
	}
}

// targetStart asks for key's listeners; listen (logical port -> TCP port, may be nil) names the
// TCP ports to bind, which the reply must then have.
func (m *VmigdProxyManager) targetStart(key string, sockets map[string]string, tls bool,
	listen map[string]int) (map[string]int, error) {
	var r struct {
		Target struct {
			Ports map[string]int `json:"targetDirectMigrationNodePorts"`
		} `json:"target"`
	}
	req := map[string]interface{}{"op": "target-start", "key": key, "sockets": sockets,
		"kubevirt": true, "tls": tls}
	if len(listen) > 0 {
		req["listen"] = listen
	}
	if err := m.call("target-start", key, req, &r); err != nil {
		return nil, err
	}
	why := vmigdCheckPorts(r.Target.Ports, sockets)
	for l, tcp := range listen {
		if got, ok := r.Target.Ports[strconv.Itoa(tcp)]; why == "" && (!ok || strconv.Itoa(got) != l) {
			why = fmt.Sprintf("logical port %s is not on TCP port %d as asked", l, tcp)
		}
	}
	if why != "" {
		// whatever it made is of no use to KubeVirt; stopped, so that a retry says this again
		_ = m.call("target-stop", key, map[string]interface{}{"op": "target-stop", "key": key}, nil)
		return nil, &VmigdError{Op: "target-start", Key: key, // as Err: no trustworthy answer came
			Err: errors.New("unexpected reply: " + why + " (a vmigd without KubeVirt mode?)")}
	}
	return r.Target.Ports, nil
}

func (m *VmigdProxyManager) sourceStart(key string, s *vmigdSource) ([]string, error) {
	var r struct {
		Sockets []string `json:"sockets"`
	}
	req := map[string]interface{}{"op": "source-start", "key": key, "dir": s.baseDir, "tls": s.tls,
		"target": map[string]interface{}{
			"targetNodeAddress":              s.address,
			"targetDirectMigrationNodePorts": s.portMap,
		}}
	if s.bandwidth > 0 {
		req["bandwidth"] = s.bandwidth
	}
	if err := m.call("source-start", key, req, &r); err != nil {
		return nil, err
	}
	return r.Sockets, nil
}

// vmigdMigration is the part of a list reply's migration object this file reads.
type vmigdMigration struct {
	Key      string `json:"key"`
	Role     string `json:"role"`
	Kubevirt bool   `json:"kubevirt"`
	TLS      *bool  `json:"tls"`
	Mode     string `json:"mode"`
	Peer     string `json:"peer"`
	Cap      uint64 `json:"cap"` // bytes/s, 0: none
	Ports    []struct {
		ID       int    `json:"id"`
		Socket   string `json:"socket"`
		Listen   int    `json:"listen"`
		PeerPort int    `json:"peer_port"`
	} `json:"ports"`
}

func (mig *vmigdMigration) tls() (bool, bool) {
	if mig.TLS != nil {
		return *mig.TLS, true
	}
	if mig.Mode != "" {
		return mig.Mode != "plain", true
	}
	return true, false
}

func (mig *vmigdMigration) target() *vmigdTarget {
	t := &vmigdTarget{sockets: make(map[string]string), ports: make(map[string]int)}
	var known bool
	t.tls, known = mig.tls()
	t.partial = !known
	for _, p := range mig.Ports {
		t.sockets[strconv.Itoa(p.ID)] = p.Socket
		if p.Listen > 0 {
			t.ports[strconv.Itoa(p.Listen)] = p.ID
		} else {
			t.partial = true
		}
	}
	return t
}

func (mig *vmigdMigration) source() *vmigdSource {
	s := &vmigdSource{portMap: make(map[string]int), bandwidth: mig.Cap}
	var known bool
	s.tls, known = mig.tls()
	s.partial = !known
	// KubeVirt mode: the address alone (ports are per port); vmigd's own form: ADDR:PORT
	if host, _, err := net.SplitHostPort(mig.Peer); err == nil && host != "" {
		s.address = host
	} else if a := strings.TrimSuffix(strings.TrimPrefix(mig.Peer, "["), "]"); a != "" {
		s.address = a
	} else {
		s.partial = true
	}
	for _, p := range mig.Ports {
		s.files = append(s.files, p.Socket)
		if p.PeerPort > 0 {
			s.portMap[strconv.Itoa(p.PeerPort)] = p.ID
		} else {
			s.partial = true
		}
		// BASEDIR/migrationproxy/KEY[-PORT]-source.sock
		if d := filepath.Dir(p.Socket); filepath.Base(d) == "migrationproxy" {
			s.baseDir = filepath.Dir(d)
		}
	}
	if s.baseDir == "" {
		s.partial = true
	}
	return s
}

func (m *VmigdProxyManager) list() ([]vmigdMigration, error) {
	var r struct {
		Migrations []vmigdMigration `json:"migrations"`
	}
	if err := m.call("list", "", map[string]interface{}{"op": "list"}, &r); err != nil {
		return nil, err
	}
	return r.Migrations, nil
}

// call sends one request and reads the one reply line; vmigd closes the connection after it.
// Connect, write and read share one deadline of opts.Timeout.
func (m *VmigdProxyManager) call(op, key string, req map[string]interface{}, reply interface{}) error {
	fail := func(err error) error {
		return &VmigdError{Op: op, Key: key, Err: fmt.Errorf("control socket %s: %w", m.opts.ControlSocket, err)}
	}
	deadline := time.Now().Add(m.opts.Timeout)
	d := net.Dialer{Deadline: deadline}
	conn, err := d.Dial("unix", m.opts.ControlSocket)
	if err != nil {
		return &VmigdError{Op: op, Key: key, Err: err} // names the socket already
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return fail(err)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return fail(err)
	}
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return fail(err)
	}
	line, err := bufio.NewReader(io.LimitReader(conn, vmigdMaxReply)).ReadBytes('\n')
	if err != nil && !(errors.Is(err, io.EOF) && len(line) > 0) {
		if errors.Is(err, io.EOF) {
			err = errors.New("closed without a reply")
		}
		return fail(err)
	}
	var head struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
		Code  string `json:"code"`
	}
	if err := json.Unmarshal(line, &head); err != nil {
		return fail(fmt.Errorf("reply is not JSON: %w", err))
	}
	if !head.OK {
		if head.Error == "" {
			head.Error = "failed, without a message"
		}
		return &VmigdError{Op: op, Key: key, Code: head.Code, Msg: head.Error}
	}
	if reply != nil {
		if err := json.Unmarshal(line, reply); err != nil {
			return fail(fmt.Errorf("reply: %w", err))
		}
	}
	return nil
}

// ---- helpers ----

// vmigdCheckPorts: what is wrong with a target-start reply's port map, or "".
func vmigdCheckPorts(ports map[string]int, sockets map[string]string) string {
	if len(ports) != len(sockets) {
		return fmt.Sprintf("%d ports in targetDirectMigrationNodePorts for %d sockets", len(ports), len(sockets))
	}
	for tcp, logical := range ports {
		if p, err := strconv.Atoi(tcp); err != nil || p < 1 || p > 65535 {
			return "TCP port " + strconv.Quote(tcp)
		}
		if _, ok := sockets[strconv.Itoa(logical)]; !ok {
			return fmt.Sprintf("logical port %d was not asked for", logical)
		}
	}
	return ""
}

// vmigdLogicalPort is GetTargetListenerPorts' rule in migration-proxy.go:222-230.
func vmigdLogicalPort(key, path string) int {
	for _, port := range []int{LibvirtDirectMigrationPort, LibvirtBlockMigrationPort} {
		if strings.Contains(path, ConstructProxyKey(key, port)) {
			return port
		}
	}
	return 0
}

// vmigdGone: the request failed because nothing listens on the control socket, not because
// vmigd was slow.
func vmigdGone(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// vmigdAnyDirExists: some path's directory exists, or no path is known (then nothing says the
// entry is stale).
func vmigdAnyDirExists(paths map[string]string) bool {
	known := false
	for _, p := range paths {
		if p == "" {
			continue
		}
		known = true
		if _, err := os.Stat(filepath.Dir(p)); err == nil {
			return true
		}
	}
	return !known
}

func (s *vmigdSource) sameArgs(o *vmigdSource) bool {
	if s.partial || s.address != o.address || filepath.Clean(s.baseDir) != filepath.Clean(o.baseDir) ||
		len(s.portMap) != len(o.portMap) {
		return false
	}
	for k, v := range s.portMap {
		if w, ok := o.portMap[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func vmigdSameStrings(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func vmigdCopyPorts(in map[string]int) map[string]int {
	out := make(map[string]int, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

func vmigdPortsString(ports map[string]int) string {
	var parts []string
	for tcp, logical := range ports {
		parts = append(parts, fmt.Sprintf("%s=%d", tcp, logical))
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, ",") + "}"
}

func vmigdSplitName(name string) (string, string) {
	i := strings.IndexByte(name, '/')
	return name[:i], name[i+1:]
}
