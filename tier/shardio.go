package tier

import (
	"fmt"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// Quiescent shard I/O: the whole contents of one shard in and out of the
// store while nothing moves it (no Runner issues moves for the shard's rank
// and no move of the shard is in flight: at initialisation, at a restore
// before the planners run, at a checkpoint with the runners paused). The
// moves these make are the store's own; a caller never builds one.

// WriteHome makes src the newest contents of key and leaves the shard where
// Register leaves it: valid in its home tier only. An NVMe home is written
// through a host copy that the write-back drops, an HBM home by a copy on
// the device's host-to-device stream. len(src) must be the shard's size.
func (s *Store) WriteHome(key shard.Key, src []byte) error {
	w, err := s.Where(key)
	if err != nil {
		return err
	}
	if w.StoredBytes != int64(len(src)) {
		return fmt.Errorf("tier: write %s: %d bytes given, the shard holds %d: %w", key, len(src), w.StoredBytes, ErrBadMove)
	}
	switch w.Spec.Home {
	case shard.HBM:
		l, err := s.Acquire(key, shard.HBM, shard.Write)
		if err != nil {
			return err
		}
		defer l.Release()
		return s.deviceCopy(key.Rank, func(dev gpu.Device, h2d, _ gpu.Stream) {
			dev.CopyHostToDevice(h2d, l.Buffer(), 0, src)
		})
	case shard.NVMe:
		if _, err := s.Submit(shard.Move{Key: key, To: shard.Host, Reason: shard.Alloc}); err != nil {
			return err
		}
	}
	l, err := s.Acquire(key, shard.Host, shard.Write)
	if err != nil {
		return err
	}
	copy(l.Bytes(), src)
	l.Release()
	if w.Spec.Home != shard.NVMe {
		return nil
	}
	op, err := s.Submit(shard.Move{Key: key, From: shard.Host, To: shard.NVMe, Reason: shard.WriteBack})
	if err == nil {
		err = op.Wait()
	}
	return err
}

// ReadNewest copies the newest contents of key into dst, from whichever
// tier holds them: host RAM, HBM (a copy on the device's device-to-host
// stream), or NVMe through a host copy that is evicted after the read, so
// the residency the planner knows stays true. A shard whose data is lost
// returns the loss (it wraps ErrLost). len(dst) must be the shard's size.
func (s *Store) ReadNewest(key shard.Key, dst []byte) error {
	w, err := s.Where(key)
	if err != nil {
		return err
	}
	if w.Lost != nil {
		return w.Lost
	}
	if w.StoredBytes != int64(len(dst)) {
		return fmt.Errorf("tier: read %s: %d bytes asked, the shard holds %d: %w", key, len(dst), w.StoredBytes, ErrBadMove)
	}
	switch {
	case w.Copies[shard.Host].Valid:
	case w.Copies[shard.HBM].Valid && !w.Spec.coded(): // a coded shard's HBM copy is decoded: its stored bytes are elsewhere
		l, err := s.Acquire(key, shard.HBM, shard.Read)
		if err != nil {
			return err
		}
		defer l.Release()
		return s.deviceCopy(key.Rank, func(dev gpu.Device, _, d2h gpu.Stream) {
			dev.CopyDeviceToHost(d2h, dst, l.Buffer(), 0)
		})
	default:
		op, err := s.Fetch(key, shard.NVMe, shard.Host)
		if err == nil {
			err = op.Wait()
		}
		if err != nil {
			return err
		}
		defer func() {
			if op, err := s.Evict(key, shard.Host); err == nil {
				op.Wait()
			}
		}()
	}
	l, err := s.Acquire(key, shard.Host, shard.Read)
	if err != nil {
		return err
	}
	defer l.Release()
	copy(dst, l.Bytes())
	return nil
}

// deviceCopy enqueues a copy on rank's device and copy streams and waits
// for both streams.
func (s *Store) deviceCopy(rank int32, enqueue func(dev gpu.Device, h2d, d2h gpu.Stream)) error {
	enqueue(s.devs[rank], s.h2d[rank], s.d2h[rank])
	for _, st := range []gpu.Stream{s.h2d[rank], s.d2h[rank]} {
		if err := st.Synchronize(); err != nil {
			return fmt.Errorf("tier: rank %d: %w", rank, err)
		}
	}
	return nil
}
