package modcheck_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// clientDir is clients/go (this file is clients/go/internal/modcheck/modcheck_test.go).
func clientDir(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	dir, err := filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// goCmd runs the go command of the toolchain running this test, offline: every module the
// example needs is already in the module cache (the client's own build put it there), so a
// network fetch here would mean the example needs something the client does not.
func goCmd(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"GOPROXY=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local"}, env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// fetchGraph puts into the module cache, through the configured GOPROXY, the go.mod of every
// module the workspace's module graph names; `env` selects the workspace (GOWORK). Why: a
// workspace build loads the client's whole module graph, where the client's own build prunes it
// (go >= 1.17 modules), so it asks for go.mod files the client's build never fetched - go-spew,
// a test dependency of protocompile, on a fresh machine - and GOPROXY=off then fails for a
// reason that has nothing to do with the example. Checksums it learns go to the workspace's
// go.work.sum (a temporary folder), never to the checkout; and after this the offline build
// still can use no module outside the client's own graph.
func fetchGraph(t *testing.T, dir string, env []string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-m", "all")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"GOTOOLCHAIN=local"}, env...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go list -m all in %s (the workspace's module graph, through GOPROXY): %v\n%s", dir, err, out)
	}
}

const want = "ok order=42 key=example-producer scope=2"

// TestExampleModuleWithReplace: examples/offline, a separate module whose go.mod requires the
// client by its module path and replaces it with this checkout (docs/sdk-go.md, "Installing"),
// builds, vets and runs.
func TestExampleModuleWithReplace(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a second module")
	}
	example := filepath.Join(clientDir(t), "examples", "offline")
	bin := filepath.Join(t.TempDir(), "offline")
	goCmd(t, example, nil, "vet", "./...")
	goCmd(t, example, nil, "build", "-o", bin, ".")
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), want) {
		t.Fatalf("example printed %q (%v), want %q...", out, err, want)
	}
}

// TestWorkspaceWithoutReplace: a new module that imports the client with neither a require
// nor a replace directive, joined to this checkout by a go.work file (go work init ./app
// <checkout>/clients/go), builds and runs.
func TestWorkspaceWithoutReplace(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a second module")
	}
	work := t.TempDir()
	app := filepath.Join(work, "app")
	if err := os.MkdirAll(app, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(clientDir(t), "examples", "offline", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	mod := "module example.com/app\n\ngo 1.24.0\n" // no require: the workspace provides the client
	for name, body := range map[string][]byte{"main.go": src, "go.mod": []byte(mod)} {
		if err := os.WriteFile(filepath.Join(app, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// the workspace needs the checksums of the client's dependencies: the client's go.sum
	sum, err := os.ReadFile(filepath.Join(clientDir(t), "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(app, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	noMod := []string{"GOFLAGS=", "GOWORK=" + filepath.Join(work, "go.work")}
	goCmd(t, work, []string{"GOFLAGS=", "GOWORK="}, "work", "init", "./app", clientDir(t))
	fetchGraph(t, app, noMod)
	bin := filepath.Join(work, "app.bin")
	goCmd(t, app, noMod, "build", "-o", bin, ".")
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), want) {
		t.Fatalf("workspace build printed %q (%v), want %q...", out, err, want)
	}
}
