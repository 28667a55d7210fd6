package slicectl

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.yaml.in/yaml/v3"

	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

// dataEnv is an embedded etcd and a client of it, to check what the commands wrote.
type dataEnv struct {
	t   *testing.T
	ep  string
	cli *clientv3.Client
	src *source.Etcd
}

func newDataEnv(t *testing.T) *dataEnv {
	srv := etcdtest.Start(t)
	cli := etcdtest.Client(t, srv)
	return &dataEnv{t: t, ep: srv.Endpoint(), cli: cli, src: source.NewEtcd(cli, writer.DefaultPrefix)}
}

// data runs `slicectl data --etcd-endpoints EP ARGS...`.
func (e *dataEnv) data(args ...string) (string, string, error) {
	e.t.Helper()
	return run(e.t, append([]string{"data", "--etcd-endpoints", e.ep}, args...)...)
}

// ok runs a data command that must succeed and returns its stdout.
func (e *dataEnv) ok(args ...string) string {
	e.t.Helper()
	out, errOut, err := e.data(args...)
	require.NoError(e.t, err, "%s\nstderr: %s", strings.Join(args, " "), errOut)
	return out
}

func (e *dataEnv) revision() int64 {
	e.t.Helper()
	resp, err := e.cli.Get(context.Background(), "any", clientv3.WithCountOnly())
	require.NoError(e.t, err)
	return resp.Header.Revision
}

func (e *dataEnv) item(key string) (source.Item, bool) {
	e.t.Helper()
	it, ok, err := e.src.Get(context.Background(), []byte(key))
	require.NoError(e.t, err)
	return it, ok
}

// clockIn returns N of an output line "... at clock N".
func clockIn(t *testing.T, out string) uint64 {
	t.Helper()
	_, n, ok := strings.Cut(strings.TrimSpace(out), " at clock ")
	require.True(t, ok, "no clock in %q", out)
	var c uint64
	_, err := fmt.Sscan(n, &c)
	require.NoError(t, err, out)
	return c
}

type itemJSONOut struct {
	Key         *string `json:"key"`
	KeyBase64   *string `json:"key_base64"`
	Hash        string  `json:"hash"`
	Value       *string `json:"value"`
	ValueBase64 *string `json:"value_base64"`
	Fragments   []struct {
		ID    string `json:"id"`
		Value string `json:"value"`
	} `json:"fragments"`
}

// jsonLines decodes one object per line.
func jsonLines(t *testing.T, out string) []itemJSONOut {
	t.Helper()
	var items []itemJSONOut
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var it itemJSONOut
		require.NoError(t, dec.Decode(&it), out)
		items = append(items, it)
	}
	return items
}

func TestDataPutGetDelete(t *testing.T) {
	e := newDataEnv(t)

	out := e.ok("put", "user:1", "alice")
	assert.Regexp(t, `^put "user:1" at clock \d+\n$`, out)
	c1 := clockIn(t, out)
	it, ok := e.item("user:1")
	require.True(t, ok)
	assert.Equal(t, []byte("alice"), it.Value)

	c2 := clockIn(t, e.ok("put", "user:1", "hello", "--fragment", "msg/2"))
	out = e.ok("put", "user:1", "hi", "--fragment", "msg/1")
	assert.Regexp(t, `^put "user:1" fragment "msg/1" at clock \d+\n$`, out)
	c3 := clockIn(t, out)
	assert.Less(t, c1, c2)
	assert.Less(t, c2, c3)

	checkGetFormats(t, e)
	checkPutFromFileAndStdin(t, e, c3)
	checkDataDelete(t, e)
}

// checkGetFormats reads back user:1, with a value and two fragments, in each output format.
func checkGetFormats(t *testing.T, e *dataEnv) {
	out := e.ok("get", "user:1")
	assert.Equal(t, `key        "user:1"
hash       `+keyspace.FormatPoint(keyspace.Hash([]byte("user:1")))+`
value      "alice" (5 bytes)
fragments  2
  "msg/1"  "hi" (2 bytes)
  "msg/2"  "hello" (5 bytes)
`, out)

	items := jsonLines(t, e.ok("get", "user:1", "-o", "json"))
	require.Len(t, items, 1)
	got := items[0]
	require.NotNil(t, got.Key)
	assert.Equal(t, "user:1", *got.Key)
	assert.Equal(t, keyspace.FormatPoint(keyspace.Hash([]byte("user:1"))), got.Hash)
	require.NotNil(t, got.Value)
	assert.Equal(t, "alice", *got.Value)
	require.Len(t, got.Fragments, 2)
	assert.Equal(t, "msg/1", got.Fragments[0].ID)
	assert.Equal(t, "hi", got.Fragments[0].Value)

	// YAML: one document per item, the same fields as JSON.
	var doc struct {
		Key       string `yaml:"key"`
		Hash      string `yaml:"hash"`
		Value     string `yaml:"value"`
		Fragments []struct {
			ID    string `yaml:"id"`
			Value string `yaml:"value"`
		} `yaml:"fragments"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(e.ok("get", "user:1", "-o", "yaml")), &doc))
	assert.Equal(t, "user:1", doc.Key)
	assert.Equal(t, keyspace.FormatPoint(keyspace.Hash([]byte("user:1"))), doc.Hash)
	assert.Equal(t, "alice", doc.Value)
	require.Len(t, doc.Fragments, 2)
	assert.Equal(t, "hi", doc.Fragments[0].Value)
}

// checkPutFromFileAndStdin puts values from a file, from stdin (whose clock follows after), and
// as fragments alone or empty.
func checkPutFromFileAndStdin(t *testing.T, e *dataEnv, after uint64) {
	// The value from a file, then from stdin.
	file := filepath.Join(t.TempDir(), "v.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"name":"Bob"}`+"\n"), 0o644))
	e.ok("put", "user:2", "--file", file)
	it, _ := e.item("user:2")
	assert.Equal(t, []byte(`{"name":"Bob"}`+"\n"), it.Value, "a file is taken byte for byte")

	var stdout bytes.Buffer
	root := NewRootCommand(&stdout, &bytes.Buffer{})
	root.SetIn(strings.NewReader("from stdin"))
	root.SetArgs([]string{"data", "put", "user:3", "-", "--etcd-endpoints", e.ep, "-o", "json"})
	require.NoError(t, root.ExecuteContext(context.Background()))
	var change struct {
		Op, Key, Hash string
		Clock         uint64
	}
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &change))
	assert.Equal(t, "put", change.Op)
	assert.Equal(t, "user:3", change.Key)
	assert.Greater(t, change.Clock, after)
	it, _ = e.item("user:3")
	assert.Equal(t, []byte("from stdin"), it.Value)

	// An item of fragments alone, and an empty value, which is still a value.
	e.ok("put", "user:4", "x", "--fragment", "f")
	assert.Contains(t, e.ok("get", "user:4"), "value      none (fragments only)\n")
	got := jsonLines(t, e.ok("get", "user:4", "-o", "json"))[0]
	assert.Nil(t, got.Value)
	assert.Nil(t, got.ValueBase64)
	e.ok("put", "empty", "")
	assert.Contains(t, e.ok("get", "empty"), `value      "" (0 bytes)`)
}

// checkDataDelete deletes a fragment, then user:1 whole, then checks that deleting or getting
// what is missing fails without changing anything.
func checkDataDelete(t *testing.T, e *dataEnv) {
	// Deleting a fragment keeps the rest; deleting the item takes the fragments too.
	out := e.ok("delete", "user:1", "--fragment", "msg/1")
	assert.Regexp(t, `^deleted "user:1" fragment "msg/1" at clock \d+\n$`, out)
	it, ok := e.item("user:1")
	require.True(t, ok)
	assert.Equal(t, []source.Fragment{{ID: "msg/2", Value: []byte("hello")}}, it.Fragments)
	out = e.ok("delete", "user:1")
	assert.Regexp(t, `^deleted "user:1" at clock \d+\n$`, out)
	_, ok = e.item("user:1")
	assert.False(t, ok)

	// Missing items are errors, but not usage errors, and change nothing.
	before := e.revision()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"get", "user:1"}, `item "user:1" not found under prefix "/sliceplane/data/"`},
		{[]string{"delete", "user:1"}, `item "user:1" not found`},
		{[]string{"delete", "user:2", "--fragment", "nope"}, `item "user:2" has no fragment "nope"`},
		{[]string{"get", "user:2", "--prefix", "/other/"}, `item "user:2" not found under prefix "/other/"`},
		{[]string{"put", "k", "--file", filepath.Join(t.TempDir(), "missing")}, "reading the value: open "},
	} {
		_, _, err := e.data(c.args...)
		require.Error(t, err, c.args)
		assert.Contains(t, err.Error(), c.want)
		assert.NotErrorIs(t, err, ErrUsage, c.args)
	}
	assert.Equal(t, before, e.revision())
}

func TestDataScan(t *testing.T) {
	e := newDataEnv(t)
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for i, k := range keys {
		e.ok("put", k, strings.Repeat("v", i))
	}
	e.ok("put", "c", "f1", "--fragment", "1")
	e.ok("put", "z", "f", "--fragment", "1") // fragments only
	keys = append(keys, "z")
	before := clockIn(t, e.ok("put", "b", "later"))
	e.ok("delete", "h")
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Compare(keyspace.Hash([]byte(a)), keyspace.Hash([]byte(b)))
	})
	hash := func(k string) string { return keyspace.FormatPoint(keyspace.Hash([]byte(k))) }
	scanKeys := func(args ...string) []string {
		t.Helper()
		var ks []string
		for _, it := range jsonLines(t, e.ok(append([]string{"scan", "-o", "json"}, args...)...)) {
			require.NotNil(t, it.Key)
			assert.Equal(t, hash(*it.Key), it.Hash)
			ks = append(ks, *it.Key)
		}
		return ks
	}
	without := func(ks []string, drop string) []string {
		return slices.DeleteFunc(slices.Clone(ks), func(k string) bool { return k == drop })
	}
	now := without(keys, "h")

	assert.Equal(t, now, scanKeys(), "the whole space as of now, in hash order")
	assert.Equal(t, keys, scanKeys("--at", fmt.Sprint(before-1)), "before h was deleted")
	old := jsonLines(t, e.ok("scan", "-o", "json", "--at", fmt.Sprint(before-1), "--start", hash("b"), "--end", "end"))
	require.NotEmpty(t, old)
	assert.Equal(t, "v", *old[0].Value, "b's value before it changed")

	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"start and end", []string{"--start", hash(now[2]), "--end", hash(now[5])}, now[2:5]},
		{"slice", []string{"--slice", hash(now[1]) + "-" + hash(now[3])}, now[1:3]},
		{"slice to the end", []string{"--slice", hash(now[6]) + "-end"}, now[6:]},
		{"decimal start", []string{"--start", fmt.Sprint(keyspace.Hash([]byte(now[4])))}, now[4:]},
		{"end only", []string{"--end", hash(now[2])}, now[:2]},
		{"limit", []string{"--limit", "3"}, now[:3]},
		{"empty range of the space", []string{"--start", "0xffffffffffffffff"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) { assert.Equal(t, c.want, scanKeys(c.args...)) })
	}

	out, errOut, err := e.data("scan", "-o", "json", "--limit", "3")
	require.NoError(t, err)
	assert.Len(t, jsonLines(t, out), 3)
	assert.Contains(t, errOut, "3 items in [0x0000000000000000, end) at clock ")
	assert.Contains(t, errOut, "more follow (--limit 3)")

	// The table: fixed columns, the key last, and a summary.
	out = e.ok("scan", "--limit", "4")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 6, out)
	assert.Equal(t, []string{"HASH", "VALUE", "FRAGMENTS", "KEY"}, strings.Fields(lines[0]))
	for i, line := range lines[1:5] {
		f := strings.Fields(line)
		require.Len(t, f, 4, line)
		k := now[i]
		assert.Equal(t, []string{hash(k), sizeOf(k), fragsOf(k), fmt.Sprintf("%q", k)}, f)
	}
	assert.Regexp(t, `^4 items in \[0x0000000000000000, end\) at clock \d+; more follow \(--limit 4\)$`, lines[5])
	out = e.ok("scan")
	assert.Regexp(t, `\n8 items in \[0x0000000000000000, end\) at clock \d+\n$`, out)
}

// sizeOf and fragsOf are the table's VALUE and FRAGMENTS for the items of TestDataScan.
func sizeOf(k string) string {
	switch k {
	case "z":
		return "-"
	case "b":
		return "5"
	}
	return fmt.Sprint(strings.Index("abcdefgh", k))
}

func fragsOf(k string) string {
	if k == "c" || k == "z" {
		return "1"
	}
	return "0"
}

func TestDataHexAndBinary(t *testing.T) {
	e := newDataEnv(t)
	key := []byte{0x00, 0xff, '/', '\n'}
	out := e.ok("put", "--hex", "00FF2F0a", "0xff00")
	assert.Regexp(t, `^put 00ff2f0a at clock \d+\n$`, out)
	it, ok := e.item(string(key))
	require.True(t, ok)
	assert.Equal(t, []byte{0xff, 0x00}, it.Value)

	assert.Contains(t, e.ok("get", "--hex", "00ff2f0a"), "value      ff00 (2 bytes)\n")
	assert.Contains(t, e.ok("get", string(key)), `key        "\x00\xff/\n"`, "without --hex, quoted")

	got := jsonLines(t, e.ok("get", "--hex", "00ff2f0a", "-o", "json"))[0]
	assert.Nil(t, got.Key)
	require.NotNil(t, got.KeyBase64)
	require.NotNil(t, got.ValueBase64, "not UTF-8: base64")
	assert.Equal(t, base64.StdEncoding.EncodeToString(key), *got.KeyBase64)
	assert.Equal(t, base64.StdEncoding.EncodeToString([]byte{0xff, 0x00}), *got.ValueBase64)

	assert.Contains(t, e.ok("scan", "--hex"), " 00ff2f0a\n")
	e.ok("delete", "--hex", "00ff2f0a")
	_, ok = e.item(string(key))
	assert.False(t, ok)
}

func TestDataBadInputIsAUsageErrorAndWritesNothing(t *testing.T) {
	e := newDataEnv(t)
	e.ok("put", "k", "v")
	file := filepath.Join(t.TempDir(), "v")
	require.NoError(t, os.WriteFile(file, []byte("v"), 0o644))
	before := e.revision()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"put"}, "missing KEY (usage: slicectl data put KEY [VALUE | -]"},
		{[]string{"put", "k"}, "missing VALUE: give it as an argument, - for stdin, or --file"},
		{[]string{"put", "k", "v", "extra"}, `unexpected argument "extra"`},
		{[]string{"put", "k", "v", "--file", file}, `VALUE "v" and --file`},
		{[]string{"put", "", "v"}, "KEY is empty"},
		{[]string{"put", "k", "v", "--fragment", ""}, "--fragment is empty"},
		{[]string{"put", "--hex", "zz", "00"}, `KEY "zz" is not hex`},
		{[]string{"put", "--hex", "00", "abc"}, `VALUE "abc" is not hex`},
		{[]string{"put", "--hex", "0x", "00"}, "KEY is empty"},
		{[]string{"put", "k", "v", "-o", "xml"}, `--output "xml": want table, json or yaml`},
		{[]string{"put", "k", "v", "--timeout", "0s"}, "--timeout 0s: want a positive duration"},
		{[]string{"put", "k", "v", "--prefix", ""}, "--prefix is empty"},
		{[]string{"put", "k", "v", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"get"}, "missing KEY"},
		{[]string{"get", "a", "b"}, `unexpected argument "b"`},
		{[]string{"delete"}, "missing KEY"},
		{[]string{"delete", "k", "--fragment", ""}, "--fragment is empty"},
		{[]string{"delete", "--hex", "k"}, `KEY "k" is not hex`},
		{[]string{"scan", "extra"}, `unknown command "extra"`},
		{[]string{"scan", "--start", "0x10", "--end", "0x10"}, "the range [0x0000000000000010, 0x0000000000000010) is empty"},
		{[]string{"scan", "--start", "0x20", "--end", "0x10"}, "the start must be below the end"},
		{[]string{"scan", "--start", "end"}, `--start end: start: keyspace: not a point`},
		{[]string{"scan", "--start", "ff"}, `"ff" (want 0x-prefixed hex or decimal`},
		{[]string{"scan", "--end", "nope"}, `end: keyspace: not a point of the hash space: "nope"`},
		{[]string{"scan", "--slice", "0x10"}, `--slice "0x10": want START-END`},
		{[]string{"scan", "--slice", "0x10-0x5"}, "--slice 0x10-0x5: the range"},
		{[]string{"scan", "--slice", "0-end", "--start", "0"}, "--slice and --start/--end: give one or the other"},
		{[]string{"scan", "--limit", "-1"}, "--limit -1: want 0 (no limit) or more"},
		{[]string{"scan", "--at", "1000000"}, "--at 1000000: the current clock is"},
		{[]string{"scan", "--at", "-1"}, `invalid argument "-1" for "--at"`},
		{[]string{"bogus"}, `unknown command "bogus" for "slicectl data"`},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			out, _, err := e.data(c.args...)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrUsage)
			assert.Contains(t, err.Error(), c.want)
			assert.Empty(t, out)
		})
	}
	// Without the test's endpoint given first (a repeated --etcd-endpoints adds to the list).
	for args, want := range map[string]string{"": "--etcd-endpoints is empty", e.ep + ",,x": "an endpoint is empty"} {
		_, _, err := run(t, "data", "put", "k", "v2", "--etcd-endpoints", args)
		require.ErrorIs(t, err, ErrUsage, args)
		assert.Contains(t, err.Error(), want)
	}
	assert.Equal(t, before, e.revision(), "nothing was written")
	it, _ := e.item("k")
	assert.Equal(t, []byte("v"), it.Value)
}

func TestDataUnreachableEtcdFailsWithinTheTimeout(t *testing.T) {
	for _, args := range [][]string{{"put", "k", "v"}, {"get", "k"}, {"delete", "k"}, {"scan"}} {
		t.Run(args[0], func(t *testing.T) {
			start := time.Now()
			_, errOut, err := run(t, append([]string{"data", "--etcd-endpoints", "127.0.0.1:1", "--timeout", "300ms"}, args...)...)
			require.Error(t, err)
			assert.Less(t, time.Since(start), 3*time.Second, "--timeout bounds the command")
			assert.NotErrorIs(t, err, ErrUsage)
			assert.Contains(t, err.Error(), "etcd at 127.0.0.1:1 gave no answer within --timeout 300ms")
			assert.Empty(t, errOut, "the etcd client's retries are not logged")
		})
	}
}

func TestDataHelp(t *testing.T) {
	for _, cmd := range []string{"put", "get", "delete", "scan"} {
		out, _, err := run(t, "data", cmd, "--help")
		require.NoError(t, err)
		assert.Contains(t, out, "Examples:", cmd)
		assert.Contains(t, out, "slicectl data "+cmd, cmd)
		assert.Contains(t, out, "--etcd-endpoints", cmd)
	}
	help, _, err := run(t, "data", "--help")
	require.NoError(t, err)
	for _, s := range []string{"put", "get", "delete", "scan", "127.0.0.1:2379", writer.DefaultPrefix, "--timeout", "--output", "--hex"} {
		assert.Contains(t, help, s)
	}
	bare, _, err := run(t, "data")
	require.NoError(t, err)
	assert.Equal(t, help, bare, "data alone shows its help")
	root, _, err := run(t, "--help")
	require.NoError(t, err)
	assert.Contains(t, root, "data")
}

// TestDataOfATarget: with --target and no --prefix, items go to the target's data prefix;
// --prefix still wins.
func TestDataOfATarget(t *testing.T) {
	e := newDataEnv(t)
	_, _, err := run(t, "--target", "kv", "data", "put", "user:1", "alice", "--etcd-endpoints", e.ep)
	require.NoError(t, err)
	resp, err := e.cli.Get(t.Context(), "/sliceplane/t/kv/data/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	assert.Equal(t, int64(1), resp.Count, "the item is kv's")
	_, ok := e.item("user:1")
	assert.False(t, ok, "not the default target's")
	_, _, err = run(t, "--target", "kv", "data", "put", "user:2", "bob", "--etcd-endpoints", e.ep, "--prefix", writer.DefaultPrefix)
	require.NoError(t, err)
	_, ok = e.item("user:2")
	assert.True(t, ok, "--prefix wins")
}
