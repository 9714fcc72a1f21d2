/* The daemon's one error type (err.h). */
#include "err.h"

#include <stddef.h>

static const struct {
    int pub;
    const char *name, *text;
} errs[OBD_ERR_COUNT] = {
#define XX(name, pub, text) \
    [OBD_ERR_INDEX_##name] = {pub, "OBD_E_" #name, text},
    OBD_ERR_MAP(XX)
#undef XX
};

static int is_err(int err)
{
    return err < 0 && err >= -OBD_ERR_COUNT;
}

int obd_err_public(int err)
{
    if (err == 0)
        return 0;
    return is_err(err) ? errs[-1 - err].pub : OBCOMM_E_PROTO;
}

int obd_err_from_public(int code)
{
    if (code == 0)
        return 0;
    for (int i = 0; i < OBD_ERR_COUNT; i++)
        if (errs[i].pub == code)
            return -1 - i;
    return OBD_E_PROTO;
}

const char *obd_err_name(int err)
{
    return is_err(err) ? errs[-1 - err].name : "OBD_E_?";
}

const char *obd_err_str(int err)
{
    if (err == 0)
        return "success";
    return is_err(err) ? errs[-1 - err].text : "unknown error";
}
