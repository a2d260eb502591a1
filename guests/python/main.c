/*
 * Cordon's Python guest: CPython, statically linked for wasm32-wasi, as a WASI reactor with
 * two exports (built by scripts/guests.d/30-wasm.sh, ADR 0020).
 *
 * cordon_init starts the interpreter and imports cordon_runner (which preloads the standard
 * library modules the tier offers). It runs once, when the guest is built, under Wizer, which
 * snapshots the initialized memory into a new module whose _start is cordon_run. So every exec
 * starts from an interpreter that is already up and has its modules imported.
 *
 * cordon_run is one exec. It forgets what the C library learned from the build's WASI context
 * (its preopened directories and environment) so that both are read again from the exec's own
 * context, hands the exec's arguments and environment to cordon_runner.main, and exits with
 * the status main returns.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>
#include <wasi/api.h>

/* wasi-libc's hooks for pre-initialized programs. */
void __wasilibc_reset_preopens(void);
void __wasilibc_deinitialize_environ(void);
void __wasilibc_initialize_environ(void);
extern char **environ;
extern char *__wasilibc_cwd;

/* The standard library's directory while the guest is initialized (the build preopens it). */
#ifndef CORDON_PYTHON_HOME
#define CORDON_PYTHON_HOME L"/usr/local"
#endif

static PyObject *runner_main;

static void fail(const char *what) {
    if (PyErr_Occurred()) {
        PyErr_Print();
    }
    fprintf(stderr, "cordon python guest: %s\n", what);
    fflush(stderr);
    __wasi_proc_exit(70);
}

__attribute__((export_name("cordon_init"))) void cordon_init(void) {
    /* UTF-8 mode: the file system, the arguments and stdio are UTF-8, whatever the locale
     * (an isolated configuration would otherwise take the C locale's ASCII). */
    PyPreConfig preconfig;
    PyPreConfig_InitIsolatedConfig(&preconfig);
    preconfig.utf8_mode = 1;
    PyStatus status = Py_PreInitialize(&preconfig);
    if (PyStatus_Exception(status)) {
        Py_ExitStatusException(status);
    }
    PyConfig config;
    PyConfig_InitIsolatedConfig(&config);
    /* No site (no site-packages, no .pth files), no bytecode written, no signal handlers. */
    config.site_import = 0;
    config.write_bytecode = 0;
    config.install_signal_handlers = 0;
    /* The snapshot fixes the hash secret for every exec anyway: make it the documented
     * constant rather than randomness of the build machine. */
    config.use_hash_seed = 1;
    config.hash_seed = 0;
    status = PyConfig_SetString(&config, &config.home, CORDON_PYTHON_HOME);
    if (PyStatus_Exception(status)) {
        PyConfig_Clear(&config);
        Py_ExitStatusException(status);
    }
    status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        Py_ExitStatusException(status);
    }
    PyObject *runner = PyImport_ImportModule("cordon_runner");
    if (runner == NULL) {
        fail("importing cordon_runner failed");
    }
    runner_main = PyObject_GetAttrString(runner, "main");
    Py_DECREF(runner);
    if (runner_main == NULL) {
        fail("cordon_runner has no main");
    }
    /* Every exec runs in /work, the scratch dir the host preopens there: the C library's
     * working directory is set once, here, rather than by a chdir (and its host calls) in
     * every exec. The string is never freed: the library frees only what its chdir made. */
    __wasilibc_cwd = (char *)"/work";
}

/* The exec's arguments (argv[0] included) as a list of str (UTF-8; bytes that are not, as
 * surrogates, as CPython decodes its own arguments). */
static PyObject *exec_args(void) {
    __wasi_size_t argc = 0, size = 0;
    if (__wasi_args_sizes_get(&argc, &size) != 0) {
        return PyList_New(0);
    }
    char **argv = calloc(argc + 1, sizeof(char *));
    char *buf = malloc(size + 1);
    if (argv == NULL || buf == NULL || __wasi_args_get((uint8_t **)argv, (uint8_t *)buf) != 0) {
        free(argv);
        free(buf);
        return PyErr_NoMemory();
    }
    PyObject *list = PyList_New(argc);
    for (__wasi_size_t i = 0; list != NULL && i < argc; i++) {
        PyObject *s = PyUnicode_DecodeUTF8(argv[i], strlen(argv[i]), "surrogateescape");
        if (s == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, s);
    }
    free(argv);
    free(buf);
    return list;
}

/* The exec's environment as a list of "NAME=value" str. */
static PyObject *exec_env(void) {
    PyObject *list = PyList_New(0);
    for (char **e = environ; list != NULL && e != NULL && *e != NULL; e++) {
        PyObject *s = PyUnicode_DecodeUTF8(*e, strlen(*e), "surrogateescape");
        if (s == NULL || PyList_Append(list, s) != 0) {
            Py_XDECREF(s);
            Py_CLEAR(list);
            break;
        }
        Py_DECREF(s);
    }
    return list;
}

__attribute__((export_name("cordon_run"))) void cordon_run(void) {
    __wasilibc_reset_preopens();
    __wasilibc_deinitialize_environ();
    __wasilibc_initialize_environ();
    PyObject *args = exec_args();
    PyObject *env = args == NULL ? NULL : exec_env();
    if (env == NULL) {
        fail("could not read the exec's arguments and environment");
    }
    PyObject *result = PyObject_CallFunctionObjArgs(runner_main, args, env, NULL);
    if (result == NULL) {
        fail("the runner failed");
    }
    long code = PyLong_AsLong(result);
    if (code == -1 && PyErr_Occurred()) {
        fail("the runner returned no status");
    }
    if (code != 0) {
        __wasi_proc_exit((__wasi_exitcode_t)code);
    }
}
