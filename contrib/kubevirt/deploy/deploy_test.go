// SPDX-License-Identifier: Apache-2.0
// Checks the sidecar in kustomize/vmigd/kubevirt-cr-vmigd.yaml against itself, vmigd's settings
// (kustomize/vmigd/vmigd.conf, each overlay's release.conf) and what virt-operator renders at
// kubevirt d923fdb8 (pkg/virt-operator/resource/generate/components/daemonsets.go): the same
// control socket everywhere, every mount backed by a volume, certificate paths inside their
// mounts, a drain that ends inside the pod's grace; and that vmigd accepts the arguments and
// the configuration files. Standard library only: the YAML files are read as text.
// test_kustomize.py renders the overlays themselves.

package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"vmigd/contrib/kubevirt/internal/testpki"
)

type container struct {
	Name    string   `json:"name"`
	Command []string `json:"command"`
	Args    []string `json:"args"`
	Env     []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"env"`
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
	ReadinessProbe, LivenessProbe *struct {
		Exec struct {
			Command []string `json:"command"`
		} `json:"exec"`
	}
	SecurityContext struct {
		Privileged *bool `json:"privileged"`
	} `json:"securityContext"`
}

type patch struct {
	Spec struct {
		Template struct {
			Spec struct {
				Containers []container `json:"containers"`
				Volumes    []struct {
					Name string `json:"name"`
				} `json:"volumes"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

// Volumes virt-operator gives the virt-handler pod (daemonsets.go: attachCertificateSecret names
// each volume after its secret; virt-share-dir is the hostPath /var/run/kubevirt).
var renderedVolumes = map[string]bool{
	"kubevirt-virt-handler-server-certs":           true,
	"kubevirt-virt-handler-migration-client-certs": true,
	"virt-share-dir": true,
}

const handlerShareDir = "/var/run/kubevirt" // virt-handler's mount of the host's /var/run/kubevirt

const crPatch = "kustomize/vmigd/kubevirt-cr-vmigd.yaml"

// The patch text of the CR's `patch: |` block, and the CR file.
func patchBlock(t *testing.T) ([]byte, string) {
	y, err := os.ReadFile(crPatch)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(y), "\n")
	var block []string
	indent := -1
	for i, l := range lines {
		if strings.TrimSpace(l) == "patch: |" {
			for _, b := range lines[i+1:] {
				if strings.TrimSpace(b) == "" {
					break
				}
				n := len(b) - len(strings.TrimLeft(b, " "))
				if indent < 0 {
					indent = n
				}
				if n < indent {
					break
				}
				block = append(block, b[indent:])
			}
			break
		}
	}
	if len(block) == 0 {
		t.Fatalf("no `patch: |` block in %s", crPatch)
	}
	return []byte(strings.Join(block, "\n")), string(y)
}

func loadPatch(t *testing.T) (patch, []byte) {
	raw, y := patchBlock(t)
	var p patch
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatalf("the CR's patch is not JSON (virt-operator's strategic merge needs JSON): %v", err)
	}
	for _, want := range []string{"resourceType: DaemonSet", "resourceName: virt-handler", "type: strategic"} {
		if !strings.Contains(y, want) {
			t.Errorf("%s lacks %q", crPatch, want)
		}
	}
	return p, raw
}

// A setting of a vmigd configuration file ("name value" lines, # comments).
func confValue(t *testing.T, path, key string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if i := strings.IndexByte(l, '#'); i >= 0 {
			l = l[:i]
		}
		f := strings.Fields(l)
		if len(f) == 2 && f[0] == key {
			return f[1]
		}
	}
	return ""
}

func argValue(args []string, flag string) (string, bool) {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			return args[i+1], true
		}
	}
	return "", false
}

func TestSidecarPatch(t *testing.T) {
	p, _ := loadPatch(t)
	spec := p.Spec.Template.Spec
	var handler, vmigd *container
	for i := range spec.Containers {
		switch spec.Containers[i].Name {
		case "virt-handler":
			handler = &spec.Containers[i]
		case "vmigd":
			vmigd = &spec.Containers[i]
		}
	}
	if handler == nil || vmigd == nil {
		t.Fatal("the patch needs both the virt-handler and the vmigd container")
	}
	// virt-operator renders command [virt-handler] and the flags as args, appends --max-devices
	// to the first container's command and --migration-cn-types to its args: the patch keeps
	// virt-handler first and gives it only VMIGD_CONTROL, which a stock virt-handler ignores
	if spec.Containers[0].Name != "virt-handler" {
		t.Errorf("the first container is %s, not virt-handler", spec.Containers[0].Name)
	}
	if handler.Command != nil || handler.Args != nil {
		t.Errorf("the patch changes virt-handler's command %v or args %v", handler.Command, handler.Args)
	}
	var sock string
	for _, e := range handler.Env {
		if e.Name == "VMIGD_CONTROL" {
			sock = e.Value
		}
	}
	if !strings.HasPrefix(sock, handlerShareDir+"/") {
		t.Errorf("VMIGD_CONTROL %q is not under virt-handler's %s mount", sock, handlerShareDir)
	}
	if c, _ := argValue(vmigd.Args, "--control"); c != sock {
		t.Errorf("vmigd --control %q, virt-handler uses %q", c, sock)
	}

	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = true
	}
	mounts := map[string]string{}
	for _, m := range vmigd.VolumeMounts {
		if !volumes[m.Name] && !renderedVolumes[m.Name] {
			t.Errorf("mount %s: no such volume in the patch or the rendered DaemonSet", m.Name)
		}
		mounts[m.MountPath] = m.Name
	}
	if mounts[filepath.Dir(sock)] != "vmigd-socket-dir" {
		t.Errorf("the control socket's directory %s is not the vmigd-socket-dir mount", filepath.Dir(sock))
	}
	inMount := func(flag, volume string) {
		v, ok := argValue(vmigd.Args, flag)
		if !ok {
			t.Errorf("vmigd has no %s", flag)
			return
		}
		if mounts[filepath.Dir(v)] != volume {
			t.Errorf("%s %s is not in the %s mount", flag, v, volume)
		}
	}
	inMount("--tls-cert", "kubevirt-virt-handler-server-certs")
	inMount("--tls-key", "kubevirt-virt-handler-server-certs")
	inMount("--tls-client-cert", "kubevirt-virt-handler-migration-client-certs")
	inMount("--tls-client-key", "kubevirt-virt-handler-migration-client-certs")
	inMount("--tls-ca", "vmigd-kubevirt-ca")

	// vmigd's drain ends before virt-handler's (--graceful-shutdown-seconds 315) and the pod's
	// grace (330 s) run out
	d, _ := argValue(vmigd.Args, "--drain-timeout")
	if n, err := strconv.Atoi(d); err != nil || n <= 0 || n > 300 {
		t.Errorf("--drain-timeout %q", d)
	}
	if _, ok := argValue(vmigd.Args, "--metrics"); ok {
		t.Error("--metrics on the command line would win over vmigd.conf's")
	}
	if m := confValue(t, "kustomize/vmigd/vmigd.conf", "metrics"); !strings.HasPrefix(m, "127.0.0.1:") {
		t.Errorf("metrics %q: the default serves localhost only (vmigd.conf says how to widen it)", m)
	}
	inMount("--config", "vmigd-config")
	if vmigd.SecurityContext.Privileged == nil || !*vmigd.SecurityContext.Privileged {
		t.Error("vmigd must be privileged, as virt-handler is, to reach /proc/PID/root of launchers")
	}
	// vmigctl in the vmigd container (the probes, kubectl exec) finds the socket in
	// VMIGD_CONTROL unless given -c
	var vmigctlSock string
	for _, e := range vmigd.Env {
		if e.Name == "VMIGD_CONTROL" {
			vmigctlSock = e.Value
		}
	}
	if vmigctlSock != sock {
		t.Errorf("VMIGD_CONTROL %q in the vmigd container, vmigd listens on %q", vmigctlSock, sock)
	}
	for _, probe := range [][]string{vmigd.ReadinessProbe.Exec.Command, vmigd.LivenessProbe.Exec.Command} {
		c, ok := argValue(probe, "-c")
		if !ok {
			c = vmigctlSock
		}
		if c != sock {
			t.Errorf("probe %v does not ask %s", probe, sock)
		}
	}
}

func TestMetricsPort(t *testing.T) {
	m := confValue(t, "kustomize/vmigd/vmigd.conf", "metrics")
	port := m[strings.LastIndexByte(m, ':')+1:]
	y, err := os.ReadFile("kustomize/vmigd/vmigd-metrics.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(y), "port: "+port) || !strings.Contains(string(y), "targetPort: "+port) {
		t.Errorf("vmigd-metrics.yaml does not use vmigd's metrics port %s", port)
	}
}

// The sidecar's arguments, with its paths moved under a temporary root, KubeVirt-like
// certificates there and the configuration files of each overlay (vmigd.conf, and release.conf
// of main, v1.8 or v1.9), pass `vmigd -n` (check the configuration and exit) of the vmigd in
// $VMIGD (else ../../../build/vmigd): no option the manifest or the files use is unknown to the
// daemon it ships.
func TestSidecarArgsAcceptedByVmigd(t *testing.T) {
	bin := os.Getenv("VMIGD")
	if bin == "" {
		bin = "../../../build/vmigd"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no vmigd to check the arguments with (%v): set VMIGD", err)
	}
	p, _ := loadPatch(t)
	var args []string
	for _, c := range p.Spec.Template.Spec.Containers {
		if c.Name == "vmigd" {
			args = c.Args
		}
	}
	// main's release.conf is the shared one
	for release, dir := range map[string]string{"main": "vmigd", "v1.8": "v1.8", "v1.9": "v1.9"} {
		root := t.TempDir()
		pki := testpki.Make(t, filepath.Join(root, "pki"))
		place := map[string]string{
			"--tls-cert": pki.ServerCert, "--tls-key": pki.ServerKey, "--tls-ca": pki.CA,
			"--tls-client-cert": pki.ClientCert, "--tls-client-key": pki.ClientKey,
		}
		moved := append([]string{"-n"}, args...)
		for i := 1; i+1 < len(moved); i++ {
			v := moved[i+1]
			if !strings.HasPrefix(v, "/") {
				continue
			}
			dst := filepath.Join(root, v)
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				t.Fatal(err)
			}
			src, ok := place[moved[i]]
			switch {
			case moved[i] == "--config" && filepath.Base(v) == "release.conf":
				src, ok = filepath.Join("kustomize", dir, "release.conf"), true
			case moved[i] == "--config":
				src, ok = filepath.Join("kustomize/vmigd", filepath.Base(v)), true
			}
			if ok {
				b, err := os.ReadFile(src)
				if err != nil {
					t.Fatal(err)
				}
				mode := os.FileMode(0o600)
				if moved[i] == "--config" {
					mode = 0o644 // a ConfigMap's files are root's, mode 0644
				}
				if err := os.WriteFile(dst, b, mode); err != nil {
					t.Fatal(err)
				}
			}
			moved[i+1] = dst
		}
		out, err := exec.Command(bin, moved...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: vmigd %s: %v\n%s", release, strings.Join(moved, " "), err, out)
		}
		t.Logf("%s: %s", release, out)
	}
}
