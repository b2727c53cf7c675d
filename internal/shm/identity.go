package shm

// IdentityFile and KeyFile are the store's record of the node that holds
// it (see identity.go): its gid and listen address, and its private key.
const (
	IdentityFile = ".identity"
	KeyFile      = ".node-key"
)
