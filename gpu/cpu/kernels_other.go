//go:build !amd64 || purego

package cpu

// haveAsm is false: only the pure-Go kernels exist on this architecture.
const haveAsm = false

// The kernel tables are empty; devices never select them.
var (
	dotTiles    [3][5][5]func(*tileArgs)
	streamTiles [3][5][5]func(*tileArgs)
	axpyTiles   [3][5][5]func(*tileArgs)
)
