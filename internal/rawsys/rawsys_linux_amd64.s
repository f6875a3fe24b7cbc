#include "textflag.h"

// func rawSyscall(trap, a1 uintptr, p unsafe.Pointer, a3, a4 uintptr) (r1 uintptr, errno Errno)
//
// The kernel returns -errno in AX for an error, a value in [-4095, -1].
TEXT ·rawSyscall(SB),NOSPLIT,$0-56
	MOVQ	a1+8(FP), DI
	MOVQ	p+16(FP), SI
	MOVQ	a3+24(FP), DX
	MOVQ	a4+32(FP), R10
	MOVQ	trap+0(FP), AX
	SYSCALL
	CMPQ	AX, $0xfffffffffffff001
	JLS	ok
	MOVQ	$-1, r1+40(FP)
	NEGQ	AX
	MOVQ	AX, errno+48(FP)
	RET
ok:
	MOVQ	AX, r1+40(FP)
	MOVQ	$0, errno+48(FP)
	RET
