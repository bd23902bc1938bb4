// Package deploy holds the Kubernetes manifests of rdmakit (device
// plugin, CNI, exporter, a coll-perf Job, a Multus network); its test
// decodes every manifest strictly into the Kubernetes API types and
// checks what rdmakit itself reads from them.
package deploy

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/rdmakit/rdmakit/coll"
	"github.com/rdmakit/rdmakit/internal/kube/deviceplugin"
)

// docs splits a YAML file into its documents.
func docs(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, d := range bytes.Split(b, []byte("\n---\n")) {
		if len(bytes.TrimSpace(d)) > 0 {
			out = append(out, d)
		}
	}
	return out
}

type objects struct {
	configMaps []corev1.ConfigMap
	daemonSets []appsv1.DaemonSet
	jobs       []batchv1.Job
	services   []corev1.Service
	nads       []map[string]any
}

// decodeAll decodes every manifest under deploy/ strictly (an unknown or
// misspelt field fails) into its API type.
func decodeAll(t *testing.T) objects {
	t.Helper()
	files, _ := filepath.Glob("*.yaml")
	if len(files) < 5 {
		t.Fatalf("manifests: %v", files)
	}
	var o objects
	for _, f := range files {
		for i, d := range docs(t, f) {
			var meta struct{ APIVersion, Kind string }
			if err := yaml.Unmarshal(d, &meta); err != nil {
				t.Fatalf("%s #%d: %v", f, i, err)
			}
			strict := func(v any) {
				if err := yaml.UnmarshalStrict(d, v); err != nil {
					t.Errorf("%s #%d (%s): %v", f, i, meta.Kind, err)
				}
			}
			switch meta.APIVersion + " " + meta.Kind {
			case "v1 ConfigMap":
				var v corev1.ConfigMap
				strict(&v)
				o.configMaps = append(o.configMaps, v)
			case "apps/v1 DaemonSet":
				var v appsv1.DaemonSet
				strict(&v)
				o.daemonSets = append(o.daemonSets, v)
			case "batch/v1 Job":
				var v batchv1.Job
				strict(&v)
				o.jobs = append(o.jobs, v)
			case "v1 Service":
				var v corev1.Service
				strict(&v)
				o.services = append(o.services, v)
			case "k8s.cni.cncf.io/v1 NetworkAttachmentDefinition":
				var v map[string]any
				strict(&v)
				o.nads = append(o.nads, v)
			default:
				t.Errorf("%s #%d: unexpected %s %s", f, i, meta.APIVersion, meta.Kind)
			}
		}
	}
	return o
}

func TestManifests(t *testing.T) {
	o := decodeAll(t)
	if len(o.configMaps) != 1 || len(o.daemonSets) != 3 || len(o.jobs) != 1 || len(o.services) != 2 || len(o.nads) != 1 {
		t.Fatalf("objects: %d ConfigMaps, %d DaemonSets, %d Jobs, %d Services, %d NADs", len(o.configMaps), len(o.daemonSets), len(o.jobs), len(o.services), len(o.nads))
	}
	// The device plugin's configuration is one rdmakit accepts.
	cfg, err := deviceplugin.ParseConfig([]byte(o.configMaps[0].Data["device-plugin.json"]))
	if err != nil {
		t.Fatalf("ConfigMap config: %v", err)
	}
	names := map[string]bool{}
	for _, r := range cfg.ConfigList {
		names[r.FullName()] = true
	}
	for _, ds := range o.daemonSets {
		sel := ds.Spec.Selector.MatchLabels
		for k, v := range sel {
			if ds.Spec.Template.Labels[k] != v {
				t.Errorf("%s: selector %s=%s does not match the pod labels", ds.Name, k, v)
			}
		}
		for _, c := range ds.Spec.Template.Spec.Containers {
			if len(c.Args) > 0 && c.Args[0] == "device-plugin" {
				mounts := map[string]bool{}
				for _, m := range c.VolumeMounts {
					mounts[m.MountPath] = true
				}
				if !mounts["/var/lib/kubelet/device-plugins"] || !mounts["/etc/rdmakit"] {
					t.Errorf("device plugin mounts %v", mounts)
				}
			}
		}
	}
	// The Job asks for a configured resource and gives coll what its
	// launcher detection reads.
	job := o.jobs[0]
	if job.Spec.CompletionMode == nil || *job.Spec.CompletionMode != batchv1.IndexedCompletion || *job.Spec.Completions != *job.Spec.Parallelism {
		t.Errorf("Job: not an indexed Job with parallelism = completions")
	}
	c := job.Spec.Template.Spec.Containers[0]
	for r := range c.Resources.Limits {
		if !names[string(r)] {
			t.Errorf("Job requests %s, which the ConfigMap does not configure (%v)", r, names)
		}
	}
	for _, e := range c.Env {
		t.Setenv(e.Name, e.Value)
	}
	t.Setenv("JOB_COMPLETION_INDEX", "2")
	l, err := coll.DetectLaunch()
	if err != nil || l.Launcher != "kubernetes" || l.Rank != 2 || int32(l.NRanks) != *job.Spec.Completions ||
		l.Addr != job.Name+"-0."+job.Spec.Template.Spec.Subdomain+":29517" {
		t.Errorf("coll sees %+v %v", l, err)
	}
	// The NetworkAttachmentDefinition's config is a chain ending in rdmakit-cni.
	spec, _ := o.nads[0]["spec"].(map[string]any)
	var conf struct {
		CNIVersion string `json:"cniVersion"`
		Plugins    []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	s, _ := spec["config"].(string)
	if err := json.Unmarshal([]byte(s), &conf); err != nil || conf.CNIVersion != "1.0.0" || len(conf.Plugins) < 2 || conf.Plugins[len(conf.Plugins)-1].Type != "rdmakit-cni" {
		t.Errorf("NAD config %v: %+v", err, conf)
	}
}

func TestExampleConfig(t *testing.T) {
	b, err := os.ReadFile("example.json")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := deviceplugin.ParseConfig(b); err != nil {
		t.Error(err)
	}
}

func TestDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil || len(d.Panels) == 0 {
		t.Fatalf("dashboard: %v", err)
	}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			if !strings.Contains(tg.Expr, "rdma") {
				t.Errorf("panel %q: %q names no rdmakit metric", p.Title, tg.Expr)
			}
		}
	}
}
