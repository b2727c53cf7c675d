package fs

import "github.com/hanwen/go-fuse/v2/fuse"

// uncachedAttrs gives the kernel a zero attribute timeout where a node
// asked for uncachedAttr (one nanosecond, which go-fuse leaves alone,
// where it would replace zero by the mount's default): ports/<port>,
// whose size moves with every message.
type uncachedAttrs struct {
	fuse.RawFileSystem
}

func zeroAttrTimeout(valid *uint64, nsec *uint32) {
	if *valid == 0 && *nsec == uint32(uncachedAttr) {
		*nsec = 0
	}
}

func (u uncachedAttrs) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	st := u.RawFileSystem.Lookup(cancel, h, name, out)
	zeroAttrTimeout(&out.AttrValid, &out.AttrValidNsec)
	return st
}

func (u uncachedAttrs) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	st := u.RawFileSystem.GetAttr(cancel, in, out)
	zeroAttrTimeout(&out.AttrValid, &out.AttrValidNsec)
	return st
}

func (u uncachedAttrs) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	st := u.RawFileSystem.SetAttr(cancel, in, out)
	zeroAttrTimeout(&out.AttrValid, &out.AttrValidNsec)
	return st
}

func (u uncachedAttrs) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	st := u.RawFileSystem.Create(cancel, in, name, out)
	zeroAttrTimeout(&out.AttrValid, &out.AttrValidNsec)
	return st
}

func (u uncachedAttrs) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	st := u.RawFileSystem.Mknod(cancel, in, name, out)
	zeroAttrTimeout(&out.AttrValid, &out.AttrValidNsec)
	return st
}
