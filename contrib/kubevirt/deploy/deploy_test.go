// SPDX-License-Identifier: Apache-2.0
// Checks the manifests agree with each other and with what virt-operator renders at kubevirt
// d923fdb8 (pkg/virt-operator/resource/generate/components/daemonsets.go): the same control
// socket everywhere, every mount backed by a volume, certificate paths inside their mounts, a
// drain that ends inside the pod's grace. Standard library only: the YAML file is read as text.

package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"vmigd/contrib/kubevirt/internal/testpki"
)

type container struct {
	Name         string   `json:"name"`
	Command      []string `json:"command"`
	Args         []string `json:"args"`
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

func loadPatch(t *testing.T) (patch, []byte) {
	raw, err := os.ReadFile("virt-handler-vmigd.patch.json")
	if err != nil {
		t.Fatal(err)
	}
	var p patch
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatal(err)
	}
	return p, raw
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
	// virt-operator renders command [virt-handler] and the flags as args; the patch's command
	// keeps the binary first and adds only the socket flag
	sock, ok := argValue(handler.Command, "--migration-proxy-socket")
	if !ok || handler.Command[0] != "virt-handler" || len(handler.Command) != 3 {
		t.Fatalf("virt-handler command %v", handler.Command)
	}
	if !strings.HasPrefix(sock, handlerShareDir+"/") {
		t.Errorf("%s is not under virt-handler's %s mount", sock, handlerShareDir)
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
	if m, _ := argValue(vmigd.Args, "--metrics"); !strings.HasPrefix(m, "127.0.0.1:") {
		t.Errorf("--metrics %q: the default serves localhost only (vmigd-metrics.yaml says how to widen it)", m)
	}
	if vmigd.SecurityContext.Privileged == nil || !*vmigd.SecurityContext.Privileged {
		t.Error("vmigd must be privileged, as virt-handler is, to reach /proc/PID/root of launchers")
	}
	for _, probe := range [][]string{vmigd.ReadinessProbe.Exec.Command, vmigd.LivenessProbe.Exec.Command} {
		if c, _ := argValue(probe, "-c"); c != sock {
			t.Errorf("probe %v does not ask %s", probe, sock)
		}
	}
}

// The KubeVirt CR customization carries the same patch, as a block scalar.
func TestCRCarriesThePatch(t *testing.T) {
	_, raw := loadPatch(t)
	y, err := os.ReadFile("kubevirt-cr-vmigd.yaml")
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
		t.Fatal("no `patch: |` block in kubevirt-cr-vmigd.yaml")
	}
	var a, b interface{}
	if err := json.Unmarshal([]byte(strings.Join(block, "\n")), &a); err != nil {
		t.Fatalf("the CR's patch is not JSON (virt-operator's strategic merge needs JSON): %v", err)
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Error("kubevirt-cr-vmigd.yaml's patch differs from virt-handler-vmigd.patch.json")
	}
	for _, want := range []string{"resourceType: DaemonSet", "resourceName: virt-handler", "type: strategic"} {
		if !strings.Contains(string(y), want) {
			t.Errorf("kubevirt-cr-vmigd.yaml lacks %q", want)
		}
	}
}

func TestMetricsPort(t *testing.T) {
	p, _ := loadPatch(t)
	var m string
	for _, c := range p.Spec.Template.Spec.Containers {
		if c.Name == "vmigd" {
			m, _ = argValue(c.Args, "--metrics")
		}
	}
	port := m[strings.LastIndexByte(m, ':')+1:]
	y, err := os.ReadFile("vmigd-metrics.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(y), "port: "+port) || !strings.Contains(string(y), "targetPort: "+port) {
		t.Errorf("vmigd-metrics.yaml does not use the sidecar's metrics port %s", port)
	}
}

// The sidecar's arguments, with its paths moved under a temporary root and KubeVirt-like
// certificates there, pass `vmigd -n` (check the configuration and exit) of the vmigd in $VMIGD
// (else ../../../build/vmigd): no option the manifest uses is unknown to the daemon it ships.
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
		if src, ok := place[moved[i]]; ok {
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		moved[i+1] = dst
	}
	out, err := exec.Command(bin, moved...).CombinedOutput()
	if err != nil {
		t.Fatalf("vmigd %s: %v\n%s", strings.Join(moved, " "), err, out)
	}
	t.Logf("%s", out)
}
