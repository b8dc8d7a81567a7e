# The boot sector of the lab's idle image (lab/image/idle/build.sh): a guest that runs and waits, at no CPU cost,
# for tests that read a running machine from libvirt and never from inside it.
#
# The BIOS loads these 512 bytes at 0:7c00 and jumps here, in 16-bit real mode. The sector writes
# MACHINERY-IDLE to the first serial port, then sleeps in hlt; the BIOS timer (18.2 Hz) wakes it to look at the
# ACPI power button. When libvirt presses the button (a graceful shutdown), the guest powers itself off through
# ACPI as an operating system would, so a stop is as quick and as clean as on a booted guest.
#
# The ACPI registers: QEMU's q35 (ICH9) and pc (PIIX4) machines both have their PM1 block at I/O port 0x600,
# where SeaBIOS puts it: PM1 status at 0x600, PM1 enable at 0x602, PM1 control at 0x604. Bit 8 of status and
# enable is the power button; in control, sleep type 0 with sleep enable (bit 13) is QEMU's soft off (S5).
        .code16
        .text
        .globl start
start:
        cli
        xorw    %ax, %ax
        movw    %ax, %ds
        movw    %ax, %ss
        movw    $0x7c00, %sp
        cld
        movw    $message, %si
        movw    $0x3f8, %dx             # COM1's transmit register; QEMU's UART needs no setup
print:
        lodsb
        testb   %al, %al
        jz      armed
        outb    %al, %dx
        jmp     print
armed:
        movw    $0x602, %dx             # PM1 enable: the power button sets its status bit from now on
        movw    $0x0100, %ax
        outw    %ax, %dx
wait:
        sti
        hlt                             # until the next interrupt (the BIOS timer's, at the latest)
        movw    $0x600, %dx             # PM1 status: was the power button pressed?
        inw     %dx, %ax
        testw   $0x0100, %ax
        jz      wait
        movw    $0x604, %dx             # PM1 control: sleep enable, sleep type 0 (soft off)
        movw    $0x2000, %ax
        outw    %ax, %dx
        cli
stop:
        hlt
        jmp     stop
message:
        .asciz  "MACHINERY-IDLE\r\n"
        .org    510
        .word   0xaa55                  # the BIOS boots a sector that ends with this signature
