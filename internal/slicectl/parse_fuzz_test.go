package slicectl

import (
	"bytes"
	"testing"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// FuzzSliceRef checks that a SLICE argument the command line accepts names a slice one way,
// and reads back the same once written as the help says.
func FuzzSliceRef(f *testing.F) {
	for _, s := range []string{"0x4000000000000000", "4611686018427387904", "key:user:42", "hash:0x8000000000000001",
		"0", "", "key:", "hash:", "hash:end", "0x", "0x-1", "-1", "+5", " 0x10 ", "0X1F", "18446744073709551616",
		"0x1_0", "key:\x00\xff", "hash:key:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, arg string) {
		ref, err := parseSliceRef(arg)
		if err != nil {
			if cmdErr := sliceArgs("SLICE")(&cobra.Command{}, []string{arg}); cmdErr == nil {
				t.Fatalf("%q: sliceArgs accepts what parseSliceRef refuses (%v)", arg, err)
			}
			return
		}
		back, err := parseSliceRef(formatSliceRef(t, ref))
		if err != nil || !sameRef(back, ref) {
			t.Fatalf("%q: %v read back as %v (%v)", arg, ref, back, err)
		}
	})
}

// formatSliceRef writes ref as a SLICE argument.
func formatSliceRef(t *testing.T, ref *pb.SliceRef) string {
	switch r := ref.GetRef().(type) {
	case *pb.SliceRef_Start:
		return keyspace.FormatPoint(r.Start)
	case *pb.SliceRef_Hash:
		return "hash:" + keyspace.FormatPoint(r.Hash)
	case *pb.SliceRef_Key:
		if len(r.Key) == 0 {
			t.Fatal("a key reference to the empty key")
		}
		return "key:" + string(r.Key)
	}
	t.Fatalf("a reference to nothing: %v", ref)
	return ""
}

func sameRef(a, b *pb.SliceRef) bool {
	switch x := a.GetRef().(type) {
	case *pb.SliceRef_Start:
		y, ok := b.GetRef().(*pb.SliceRef_Start)
		return ok && x.Start == y.Start
	case *pb.SliceRef_Hash:
		y, ok := b.GetRef().(*pb.SliceRef_Hash)
		return ok && x.Hash == y.Hash
	case *pb.SliceRef_Key:
		y, ok := b.GetRef().(*pb.SliceRef_Key)
		return ok && bytes.Equal(x.Key, y.Key)
	}
	return false
}

// FuzzSplitFlags runs split's argument and flag parsing (SLICE, --at, --at-hash) as cobra
// does, and checks the request it would send.
func FuzzSplitFlags(f *testing.F) {
	f.Add("", "user:42", "", true, false)
	f.Add("0x4000000000000000", "", "0x4800000000000000", false, true)
	f.Add("0x4000000000000000", "", "", false, false)
	f.Add("", "", "", false, false)
	f.Add("", "", "", true, false)
	f.Add("key:a", "a", "1", true, true)
	f.Add("hash:1", "", "0xfffffffffffffffff", false, true)
	f.Add("", "", " 42 ", false, true)
	f.Fuzz(func(t *testing.T, slice, at, atHash string, withAt, withAtHash bool) {
		var args []string
		if slice != "" {
			args = append(args, slice)
		}
		if withAt {
			args = append(args, "--at="+at)
		}
		if withAtHash {
			args = append(args, "--at-hash="+atHash)
		}
		cmd := newSplitCommand(&globalOptions{})
		cmd.SetArgs(args)
		if err := cmd.ParseFlags(args); err != nil {
			return
		}
		pos := cmd.Flags().Args()
		if cmd.Args(cmd, pos) != nil {
			return
		}
		key, hash := cmd.Flags().Lookup("at").Value.String(), cmd.Flags().Lookup("at-hash").Value.String()
		req, err := splitRequest(cmd, pos, key, hash)
		if err != nil {
			return
		}
		checkSplit(t, req, pos, at, atHash, withAt, withAtHash)
	})
}

func checkSplit(t *testing.T, req *pb.SplitRequest, pos []string, at, atHash string, withAt, withAtHash bool) {
	t.Helper()
	if (req.GetSlice() != nil) != (len(pos) == 1) || len(pos) == 0 && req.GetAt() == nil {
		t.Fatalf("args %q: request %v", pos, req)
	}
	switch x := req.GetAt().(type) {
	case *pb.SplitRequest_AtKey:
		if !withAt || withAtHash || string(x.AtKey) != at || at == "" {
			t.Fatalf("--at %q: request %v", at, req)
		}
	case *pb.SplitRequest_AtHash:
		p, err := keyspace.ParsePoint(keyspace.FormatPoint(x.AtHash))
		if withAt || !withAtHash || err != nil || p != x.AtHash {
			t.Fatalf("--at-hash %q: request %v", atHash, req)
		}
	case nil:
		if withAt || withAtHash {
			t.Fatalf("--at %q, --at-hash %q ignored: request %v", at, atHash, req)
		}
	}
}

// FuzzScanRange checks that --start, --end and --slice give a non-empty range, and that a
// range written back as --slice reads the same.
func FuzzScanRange(f *testing.F) {
	f.Add("", "", "", false)
	f.Add("0x4000000000000000", "0x8000000000000000", "", false)
	f.Add("", "", "0xc000000000000000-end", true)
	f.Add("", "", "0x0-0x4000000000000000", true)
	f.Add("5", "5", "", false)
	f.Add("", "", "10-5", true)
	f.Add("", "", "-", true)
	f.Add("", "END", "", false)
	f.Add("1", "", "1-2", true)
	f.Fuzz(func(t *testing.T, start, end, slice string, withSlice bool) {
		args := []string{"--start=" + start, "--end=" + end}
		if withSlice {
			args = []string{"--slice=" + slice}
		}
		r, err := scanRange(args)
		if err != nil {
			return
		}
		if !r.Valid() {
			t.Fatalf("%q: accepted the empty range %s", args, r)
		}
		back, err := scanRange([]string{"--slice=" + keyspace.FormatPoint(r.Start) + "-" + r.End.String()})
		if err != nil || back != r {
			t.Fatalf("%q: %s read back as %s (%v)", args, r, back, err)
		}
	})
}

// scanRange parses the range flags of data scan from args.
func scanRange(args []string) (keyspace.Range, error) {
	cmd := newDataScanCommand(&dataOptions{})
	if err := cmd.ParseFlags(args); err != nil {
		return keyspace.Range{}, err
	}
	so := &scanOptions{}
	for name, v := range map[string]*string{"start": &so.start, "end": &so.end, "slice": &so.slice} {
		*v = cmd.Flags().Lookup(name).Value.String()
	}
	return so.hashRange(cmd)
}
