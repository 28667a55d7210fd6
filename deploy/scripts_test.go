package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runE2E runs e2e.sh with PATH set to dir only, and returns its output and exit status.
func runE2E(t *testing.T, dir string) (string, int) {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	script, err := filepath.Abs(e2eScript)
	require.NoError(t, err)
	cmd := exec.Command(bash, script)
	cmd.Env = []string{"PATH=" + dir, "HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return string(out), code
}

// toolsDir returns a directory holding links to the given commands of this machine.
func toolsDir(t *testing.T, tools ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, tool := range tools {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("no %s on this machine", tool)
		}
		require.NoError(t, os.Symlink(p, filepath.Join(dir, tool)))
	}
	return dir
}

func TestE2ESkipsWithoutDocker(t *testing.T) {
	t.Parallel()
	out, code := runE2E(t, toolsDir(t, "dirname", "timeout"))
	assert.Equal(t, 0, code, out)
	assert.Equal(t, "e2e-compose: skipped: no docker command on PATH\n", out)
}

func TestE2ESkipsWithoutEngine(t *testing.T) {
	t.Parallel()
	dir := toolsDir(t, "dirname", "timeout")
	// A docker whose engine does not answer.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "docker"), []byte("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n"), 0o755))
	out, code := runE2E(t, dir)
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "e2e-compose: skipped: the Docker engine does not answer")
}

func TestE2ESkipsWithoutCompose(t *testing.T) {
	t.Parallel()
	dir := toolsDir(t, "dirname", "timeout")
	// An engine that answers, and no compose of either kind.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "docker"), []byte("#!/bin/sh\n[ \"$1\" = info ] && exit 0\nexit 1\n"), 0o755))
	out, code := runE2E(t, dir)
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "e2e-compose: skipped: neither 'docker compose' nor 'docker-compose' is available")
}

func TestShellcheck(t *testing.T) {
	t.Parallel()
	sc, err := exec.LookPath("shellcheck")
	if err != nil {
		t.Skip("shellcheck is not on PATH (Debian: apt-get install shellcheck)")
	}
	out, err := exec.Command(sc, e2eScript, buildScript).CombinedOutput()
	assert.NoError(t, err, "shellcheck:\n%s", out)
}

func TestScriptsAreExecutable(t *testing.T) {
	for _, f := range []string{e2eScript, buildScript} {
		st, err := os.Stat(f)
		require.NoError(t, err)
		assert.NotZero(t, st.Mode()&0o111, "%s is not executable", f)
	}
}

// TestDockerfile checks the one Dockerfile against what build-images.sh stages for it.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile(dockerfile)
	require.NoError(t, err)
	script, err := os.ReadFile(buildScript)
	require.NoError(t, err)
	var froms []string
	for _, line := range strings.Split(string(data), "\n") {
		if f, ok := strings.CutPrefix(line, "FROM "); ok {
			froms = append(froms, strings.TrimSpace(f))
		}
		// Every source of a COPY is something the script stages in the context.
		if f, ok := strings.CutPrefix(line, "COPY "); ok {
			fields := strings.Fields(f)
			for _, src := range fields[:len(fields)-1] {
				if strings.HasPrefix(src, "--") {
					continue
				}
				dir, _, _ := strings.Cut(src, "/")
				assert.Regexp(t, `/`+regexp.QuoteMeta(dir)+`\b`, string(script), "COPY %s: build-images.sh stages no %s/", src, dir)
			}
		}
	}
	assert.Equal(t, []string{"scratch"}, froms, "images are built FROM scratch: there is no registry to pull from")
	assert.Regexp(t, regexp.MustCompile(`(?m)^ARG BINARY$`), string(data))
	assert.Regexp(t, regexp.MustCompile(`(?m)^USER 65534:65534$`), string(data))
}
