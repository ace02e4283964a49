/* LD_PRELOAD shim: report a fake system page size to the process it is loaded into.
 *
 * LMDB sizes the pages of a new environment from the system page size
 * (GET_PAGESIZE: sysconf(_SC_PAGE_SIZE) in mdb.c, capped at MAX_PAGESIZE), so loading
 * this shim into a process that creates an environment with py-lmdb makes it write the
 * file a machine with that page size (ARM64 or POWER with 64 KiB pages) writes.
 *
 * LMDBIO_FAKE_PAGESIZE holds the size in bytes (a power of two, 512 .. 1 MiB); unset or
 * invalid, every call passes through to the C library unchanged. sysconf(_SC_PAGESIZE)
 * and getpagesize() are faked; every other sysconf name passes through.
 *
 * Built by tests/test_page_sizes.py: cc -shared -fPIC -O2 -o pagesize.so pagesize.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

static long fake_pagesize(void)
{
    const char *s = getenv("LMDBIO_FAKE_PAGESIZE");
    char *end;
    long v;

    if (s == NULL || *s == '\0')
        return 0;
    v = strtol(s, &end, 10);
    if (*end != '\0' || v < 512 || v > (1L << 20) || (v & (v - 1)) != 0)
        return 0;
    return v;
}

long sysconf(int name)
{
    static long (*real_sysconf)(int);
    long fake;

    if (name == _SC_PAGESIZE) {  /* _SC_PAGE_SIZE is the same name */
        fake = fake_pagesize();
        if (fake)
            return fake;
    }
    if (real_sysconf == NULL)
        real_sysconf = (long (*)(int))dlsym(RTLD_NEXT, "sysconf");
    return real_sysconf(name);
}

int getpagesize(void)
{
    static int (*real_getpagesize)(void);
    long fake = fake_pagesize();

    if (fake)
        return (int)fake;
    if (real_getpagesize == NULL)
        real_getpagesize = (int (*)(void))dlsym(RTLD_NEXT, "getpagesize");
    return real_getpagesize();
}
