#include "textflag.h"

// func rawSyscall(trap, a1 uintptr, p unsafe.Pointer, a3, a4 uintptr) (r1 uintptr, errno Errno)
//
// The kernel returns -errno in R0 for an error, a value in [-4095, -1].
TEXT ·rawSyscall(SB),NOSPLIT,$0-56
	MOVD	a1+8(FP), R0
	MOVD	p+16(FP), R1
	MOVD	a3+24(FP), R2
	MOVD	a4+32(FP), R3
	MOVD	$0, R4
	MOVD	$0, R5
	MOVD	trap+0(FP), R8
	SVC
	CMN	$4095, R0
	BCC	ok
	MOVD	$-1, R4
	MOVD	R4, r1+40(FP)
	NEG	R0, R0
	MOVD	R0, errno+48(FP)
	RET
ok:
	MOVD	R0, r1+40(FP)
	MOVD	ZR, errno+48(FP)
	RET
