package flight

import (
	"context"
	"sync"
)

// Group runs at most one lookup per key at a time and keeps its result;
// a failed lookup is forgotten so that the next caller tries again. No lock
// is held while a lookup runs, so a slow lookup of one key (a DLQ topic
// being created) never delays another key. The zero Group is ready to use;
// it is safe for concurrent use. Results are kept until forgotten: one per
// key ever looked up.
type Group[T any] struct {
	mu sync.Mutex
	m  map[string]*flight[T] // guarded by mu
}

type flight[T any] struct {
	done chan struct{} // closed once val and err are set
	val  T
	err  error
}

// Do returns key's value, running fn to find it unless a lookup already
// ran or is running. A caller whose ctx ends stops waiting; the lookup goes
// on for the others, under the ctx of the caller that started it.
func (f *Group[T]) Do(ctx context.Context, key string, fn func(context.Context) (T, error)) (T, error) {
	f.mu.Lock()
	if f.m == nil {
		f.m = map[string]*flight[T]{}
	}
	fl, running := f.m[key]
	if !running {
		fl = &flight[T]{done: make(chan struct{})}
		f.m[key] = fl
	}
	f.mu.Unlock()
	if !running {
		fl.val, fl.err = fn(ctx)
		if fl.err != nil {
			f.Forget(key, fl)
		}
		close(fl.done)
	}
	select {
	case <-fl.done:
		return fl.val, fl.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// Forget drops key's result if it is still fl (nil: whatever it is), so
// the next Do looks it up again.
func (f *Group[T]) Forget(key string, fl *flight[T]) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cur, ok := f.m[key]; ok && (fl == nil || cur == fl) {
		delete(f.m, key)
	}
}

// Set records val as key's result.
func (f *Group[T]) Set(key string, val T) {
	fl := &flight[T]{done: make(chan struct{}), val: val}
	close(fl.done)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]*flight[T]{}
	}
	f.m[key] = fl
}
