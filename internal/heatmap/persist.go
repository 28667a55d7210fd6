package heatmap

import (
	"bytes"
	"compress/gzip"
	"encoding/gob"
	"fmt"
	"io"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// ChunkColumns is how many columns a persisted chunk holds: the leader rewrites the newest
// chunk as it grows, and a new leader restores the history from the chunks.
const ChunkColumns = 60

// ChunkOf returns the chunk that holds column seq.
func ChunkOf(seq uint64) uint64 { return (seq - 1) / ChunkColumns }

// chunkVersion is the encoding's version; a chunk of another is skipped on restore.
const chunkVersion = 1

type chunkFile struct {
	Version int
	Names   []string // index 0 is noNode's
	Columns []chunkColumn
	Events  []chunkEvent
}

type chunkColumn struct {
	Seq        uint64
	At         int64
	Slices     int
	Start      []uint64
	Load       []float32
	Count      []uint16
	Holder     []uint16
	Meta, Reps []uint8
}

type chunkEvent struct {
	Seq             uint64
	At              int64
	Kind            string
	Start, End      uint64
	ToEnd           bool
	Cause, By, What string
}

// Encode returns chunk k as it stands: the columns of the ring in it and their events,
// gob-encoded and gzipped. A chunk the ring holds nothing of encodes as empty.
func (h *History) Encode(k uint64) ([]byte, error) {
	f := chunkFile{Version: chunkVersion, Names: h.names}
	for i := range h.n {
		c := h.col(i)
		if ChunkOf(c.seq) != k {
			continue
		}
		f.Columns = append(f.Columns, chunkColumn{Seq: c.seq, At: c.at, Slices: c.slices, Start: c.start, Load: c.load,
			Count: c.count, Holder: c.holder, Meta: c.meta, Reps: c.reps})
	}
	for i := range h.evN {
		e := h.events[(h.evFst+i)%len(h.events)]
		if ChunkOf(e.Seq+1) != k {
			continue
		}
		f.Events = append(f.Events, chunkEvent{Seq: e.Seq, At: e.At.UnixMilli(), Kind: e.Kind, Start: e.Range.Start,
			End: e.Range.End.Point(), ToEnd: e.Range.End.IsEnd(), Cause: e.Cause, By: e.By, What: e.What})
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if err := gob.NewEncoder(zw).Encode(&f); err != nil {
		return nil, fmt.Errorf("heatmap: encoding chunk %d: %w", k, err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("heatmap: encoding chunk %d: %w", k, err)
	}
	return buf.Bytes(), nil
}

// Restore adds the columns and events of persisted chunks, which must come in order and be
// newer than what the ring holds, and goes on numbering after the last. A chunk that cannot
// be decoded is an error, and nothing of it is added.
func (h *History) Restore(data []byte) error {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("heatmap: decoding a chunk: %w", err)
	}
	var f chunkFile
	if err := gob.NewDecoder(zr).Decode(&f); err != nil && err != io.EOF {
		return fmt.Errorf("heatmap: decoding a chunk: %w", err)
	}
	if f.Version != chunkVersion {
		return fmt.Errorf("heatmap: a chunk of version %d: this assigner reads %d", f.Version, chunkVersion)
	}
	if err := f.check(h.next); err != nil {
		return err
	}
	remap := make([]uint16, len(f.Names))
	for i, n := range f.Names[1:] {
		remap[i+1] = h.intern(assignment.NodeID(n))
	}
	for _, fc := range f.Columns {
		c := h.slot(len(fc.Start))
		c.seq, c.at, c.slices = fc.Seq, fc.At, fc.Slices
		c.start, c.load, c.count = append(c.start, fc.Start...), append(c.load, fc.Load...), append(c.count, fc.Count...)
		c.meta, c.reps = append(c.meta, fc.Meta...), append(c.reps, fc.Reps...)
		for _, id := range fc.Holder {
			c.holder = append(c.holder, remap[id])
		}
		h.next = fc.Seq + 1
	}
	for _, fe := range f.Events {
		end := keyspace.At(fe.End)
		if fe.ToEnd {
			end = keyspace.End
		}
		h.add(Event{Seq: fe.Seq, At: time.UnixMilli(fe.At), Kind: fe.Kind, Range: keyspace.Range{Start: fe.Start, End: end},
			Cause: fe.Cause, By: fe.By, What: fe.What})
	}
	return nil
}

// check refuses a chunk whose columns are out of order, older than next, or inconsistent.
func (f *chunkFile) check(next uint64) error {
	if len(f.Names) == 0 {
		return fmt.Errorf("heatmap: a chunk without its names")
	}
	for _, c := range f.Columns {
		n := len(c.Start)
		switch {
		case c.Seq < next:
			return fmt.Errorf("heatmap: a chunk's column %d is not after %d", c.Seq, next-1)
		case len(c.Load) != n || len(c.Count) != n || len(c.Meta) != n || len(c.Reps) != n || len(c.Holder) != n*holders:
			return fmt.Errorf("heatmap: a chunk's column %d has arrays of different lengths", c.Seq)
		}
		for _, id := range c.Holder {
			if int(id) >= len(f.Names) {
				return fmt.Errorf("heatmap: a chunk's column %d names node %d of %d", c.Seq, id, len(f.Names))
			}
		}
		next = c.Seq + 1
	}
	return nil
}
