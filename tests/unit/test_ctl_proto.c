// SPDX-License-Identifier: Apache-2.0
/* Unit tests for control request parsing (ctrl/ctl_request.h): each op with every field checked,
 * and each way a request is refused with a one-line message (a key given twice, text that is not
 * UTF-8 among them), and replies made valid UTF-8 (ctrl/ctl_proto.h). ctl_execute() runs only to
 * refuse an op that takes the connection. Last, vmigd-test's field (ctrl/ctl_test.c, linked). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <json-c/json.h>

#include "ctl_json.h"
#include "ctl_proto.h"
#include "ctl_test.h"
#include "units.h"

/* The target JSON that `target start` prints, for source-start requests. */
#define TARGET_JSON(key)                                                                           \
	"{\"version\":1,\"key\":\"" key "\",\"address\":\"198.18.0.2\",\"port\":40123,"            \
	"\"ports\":[49152,0]}"

static int parse(const char *text, struct ctl_request *req, char *err, size_t errlen)
{
	return ctl_request_parse(text, strlen(text), req, err, errlen);
}

static struct ctl_request *parse_ok(const char *text)
{
	struct ctl_request *req = calloc(1, sizeof(*req));
	char err[512] = "";

	assert_non_null(req);
	memset(req, 0x5a, sizeof(*req));
	if (parse(text, req, err, sizeof(err)) != 0)
		fail_msg("refused (%s): %s", err, text);
	return req;
}

/* text parses, as op. */
static void check_op(const char *text, enum ctl_op op)
{
	struct ctl_request *req = parse_ok(text);

	assert_int_equal(req->op, op);
	free(req);
}

/* Returns 0 when text is refused as it should be, else prints why and returns -1. */
static int try_reject_len(const char *text, size_t len, const char *what)
{
	struct ctl_request *req = malloc(sizeof(*req)), *canary = malloc(sizeof(*req));
	char err[512];
	int r, ret = -1;

	assert_non_null(req);
	assert_non_null(canary);
	memset(req, 0x77, sizeof(*req));
	memcpy(canary, req, sizeof(*req));
	memset(err, 0, sizeof(err));
	r = ctl_request_parse(text, len, req, err, sizeof(err));
	if (r != -EINVAL)
		print_error("%s: got %d, want -EINVAL: %.200s\n", what, r, text);
	else if (err[0] == '\0')
		print_error("%s: empty error message\n", what);
	else if (strchr(err, '\n'))
		print_error("%.200s: error message is not one line: \"%s\"\n", what, err);
	else if (memcmp(req, canary, sizeof(*req)) != 0)
		print_error("%s: *req written on failure\n", what); /* filled only on success */
	else
		ret = 0;
	free(canary);
	free(req);
	return ret;
}

static void check_reject_len(const char *text, size_t len, const char *what)
{
	if (try_reject_len(text, len, what) < 0)
		fail();
}

static void check_reject(const char *text)
{
	check_reject_len(text, strlen(text), text);
}

static void test_target_start(void **state)
{
	struct ctl_request *req = parse_ok("{\"op\":\"target-start\",\"key\":\"vm-1\",\"sockets\":"
					   "{\"49152\":\"/run/vm/a.sock\",\"0\":\"/run/vm/b.sock\","
					   "\"65535\":\"/c\"}}");

	assert_int_equal(req->op, CTL_TARGET_START);
	assert_string_equal(req->key, "vm-1");
	assert_int_equal(req->nports, 3);
	/* In the order of the request, not sorted. */
	assert_int_equal(req->ports[0].id, 49152);
	assert_string_equal(req->ports[0].path, "/run/vm/a.sock");
	assert_int_equal(req->ports[1].id, 0);
	assert_string_equal(req->ports[1].path, "/run/vm/b.sock");
	assert_int_equal(req->ports[2].id, 65535);
	assert_string_equal(req->ports[2].path, "/c");
	free(req);

	req = parse_ok("{\"sockets\":{\"7\":\"/x\"},\"key\":\"K\",\"op\":\"target-start\"}");
	assert_int_equal(req->op, CTL_TARGET_START);
	assert_string_equal(req->key, "K");
	assert_int_equal(req->nports, 1);
	assert_int_equal(req->ports[0].id, 7);
	assert_string_equal(req->ports[0].path, "/x");
	free(req);
}

static void test_target_start_limits(void **state)
{
	char text[4096], path[128];
	struct ctl_request *req;
	size_t n;

	/* Eight sockets is the most. */
	n = snprintf(text, sizeof(text), "{\"op\":\"target-start\",\"key\":\"vm\",\"sockets\":{");
	for (int i = 0; i < 8; i++)
		n += snprintf(text + n, sizeof(text) - n, "%s\"%d\":\"/s%d\"", i ? "," : "",
			      49152 + i, i);
	snprintf(text + n, sizeof(text) - n, "}}");
	req = parse_ok(text);
	assert_int_equal(req->nports, 8);
	for (int i = 0; i < 8; i++) {
		char want[8];

		snprintf(want, sizeof(want), "/s%d", i);
		assert_int_equal(req->ports[i].id, 49152 + i);
		assert_string_equal(req->ports[i].path, want);
	}
	free(req);

	/* A 107-byte path fits sun_path with its NUL. */
	memset(path, 'p', 107);
	path[0] = '/';
	path[107] = '\0';
	snprintf(text, sizeof(text),
		 "{\"op\":\"target-start\",\"key\":\"vm\",\"sockets\":{\"1\":\"%s\"}}", path);
	req = parse_ok(text);
	assert_int_equal(req->nports, 1);
	assert_string_equal(req->ports[0].path, path);
	free(req);
}

static void test_stop_ops(void **state)
{
	struct ctl_request *req = parse_ok("{\"op\":\"target-stop\",\"key\":\"vm-1\"}");

	assert_int_equal(req->op, CTL_TARGET_STOP);
	assert_string_equal(req->key, "vm-1");
	free(req);
	req = parse_ok("{\"op\":\"source-stop\",\"key\":\"A.b_C-9\"}");
	assert_int_equal(req->op, CTL_SOURCE_STOP);
	assert_string_equal(req->key, "A.b_C-9");
	free(req);
}

/* What vmigd --takeover sends; the server serves it on its own connection (ctl_takeover.c). */
static void test_takeover(void **state)
{
	struct ctl_request *req =
		parse_ok("{\"op\":\"takeover\",\"pid\":4242,\"version\":\"0.1\"}");
	char *reply;

	assert_int_equal(req->op, CTL_TAKEOVER);
	assert_int_equal(req->pid, 4242);
	assert_string_equal(ctl_op_name(req->op), "takeover");
	/* The control server hands it the connection: the op table says so. */
	assert_true(ctl_op_takes_conn(req->op));
	assert_false(ctl_op_takes_conn(CTL_STATUS));
	/* Anywhere else than on the control socket, it is refused with a reason. */
	reply = ctl_execute(NULL, NULL, req);
	assert_non_null(strstr(reply, "takeover is asked for by vmigd --takeover"));
	free(reply);
	free(req);
	check_reject("{\"op\":\"takeover\"}");
	check_reject("{\"op\":\"takeover\",\"pid\":0}");
	check_reject("{\"op\":\"takeover\",\"pid\":-3}");
	check_reject("{\"op\":\"takeover\",\"pid\":\"12\"}");
	check_reject("{\"op\":\"takeover\",\"pid\":4294967297}");
}

static void test_source_start(void **state)
{
	struct ctl_request *req;

	req = parse_ok("{\"op\":\"source-start\",\"key\":\"vm-1\",\"target\":" TARGET_JSON(
		"vm-1") ",\"dir\":\"/var/lib/libvirt/qemu\"}");
	assert_int_equal(req->op, CTL_SOURCE_START);
	assert_string_equal(req->key, "vm-1");
	assert_string_equal(req->target.key, "vm-1");
	assert_string_equal(req->target.address, "198.18.0.2");
	assert_int_equal(req->target.port, 40123);
	assert_int_equal(req->target.nports, 2);
	assert_int_equal(req->target.ports[0], 49152);
	assert_int_equal(req->target.ports[1], 0);
	assert_string_equal(req->dir, "/var/lib/libvirt/qemu");
	assert_null(req->hook.hold_ms);
	free(req);

	/* An IPv6 target. */
	req = parse_ok("{\"op\":\"source-start\",\"key\":\"k\",\"dir\":\"/b\",\"target\":"
		       "{\"version\":1,\"key\":\"k\",\"address\":\"2001:db8::2\",\"port\":1,"
		       "\"ports\":[0]}}");
	assert_string_equal(req->target.address, "2001:db8::2");
	assert_int_equal(req->target.port, 1);
	assert_int_equal(req->target.nports, 1);
	assert_int_equal(req->target.ports[0], 0);
	free(req);
}

static void test_list_status(void **state)
{
	check_op("{\"op\":\"list\"}", CTL_LIST);
	check_op("{\"op\":\"status\"}", CTL_STATUS);
	/* A field the op does not take is refused, never ignored. */
	check_reject("{\"op\":\"status\",\"verbose\":true}");
}

static void test_trailing(void **state)
{
	/* What vmigctl sends: the object and a newline. */
	check_op("{\"op\":\"list\"}\n", CTL_LIST);
	check_op("{\"op\":\"list\"}\r\n", CTL_LIST);
	check_op("  {\"op\":\"target-stop\",\"key\":\"k\"}  \n", CTL_TARGET_STOP);

	check_reject("{\"op\":\"list\"}x");
	check_reject("{\"op\":\"list\"}\nx");
	check_reject("{\"op\":\"list\"}{\"op\":\"list\"}");
	check_reject("{\"op\":\"list\"}\n{\"op\":\"status\"}\n");
	check_reject("{\"op\":\"list\"}]");
	/* A NUL after the object is trailing data too. */
	check_reject_len("{\"op\":\"list\"}\0", 14, "trailing NUL");
	/* The length is what counts, not a NUL: a cut-off request is refused. */
	check_reject_len("{\"op\":\"list\"}", 12, "cut short");
}

static void test_not_json(void **state)
{
	check_reject("");
	check_reject("\n");
	check_reject("list");
	check_reject("{");
	check_reject("{\"op\":\"list\"");
	check_reject("{\"op\":list}");
	check_reject("\x01\x02\x03");
	check_reject_len("\0{\"op\":\"list\"}", 14, "leading NUL");
}

static void test_not_object(void **state)
{
	check_reject("[{\"op\":\"list\"}]");
	check_reject("[]\n");
	check_reject("\"list\"\n");
	check_reject("42\n");
	check_reject("null\n");
	check_reject("true\n");
}

static void test_op(void **state)
{
	check_reject("{}");
	check_reject("{\"key\":\"vm\"}");
	check_reject("{\"op\":null}");
	check_reject("{\"op\":1}");
	check_reject("{\"op\":[\"list\"]}");
	check_reject("{\"op\":{\"list\":1}}");
	check_reject("{\"op\":\"\"}");
	check_reject("{\"op\":\"LIST\"}");
	check_reject("{\"op\":\"list \"}");
	check_reject("{\"op\":\"target_start\",\"key\":\"vm\",\"sockets\":{\"1\":\"/a\"}}");
	check_reject("{\"op\":\"migrate\"}");
	check_reject("{\"op\":\"Metrics\"}");
	check_reject("{\"op\":\"node_bandwidth\",\"bandwidth\":1}");
	check_reject("{\"OP\":\"list\"}");
}

static void test_key(void **state)
{
	static const char *const ops[] = { "target-stop", "source-stop" };
	char text[512], key[PX_KEY_MAX + 2];

	for (size_t i = 0; i < 2; i++) {
		snprintf(text, sizeof(text), "{\"op\":\"%s\"}", ops[i]);
		check_reject(text);
		snprintf(text, sizeof(text), "{\"op\":\"%s\",\"key\":null}", ops[i]);
		check_reject(text);
		snprintf(text, sizeof(text), "{\"op\":\"%s\",\"key\":42}", ops[i]);
		check_reject(text);
		snprintf(text, sizeof(text), "{\"op\":\"%s\",\"key\":\"\"}", ops[i]);
		check_reject(text);
		snprintf(text, sizeof(text), "{\"op\":\"%s\",\"key\":\"a b\"}", ops[i]);
		check_reject(text);
		snprintf(text, sizeof(text), "{\"op\":\"%s\",\"key\":\"../etc\"}", ops[i]);
		check_reject(text);
	}
	check_reject("{\"op\":\"target-start\",\"sockets\":{\"1\":\"/a\"}}");
	check_reject("{\"op\":\"target-start\",\"key\":\"a/b\",\"sockets\":{\"1\":\"/a\"}}");
	check_reject("{\"op\":\"source-start\",\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\"}");
	check_reject("{\"op\":\"source-start\",\"key\":\"v m\",\"target\":" TARGET_JSON(
		"vm") ",\"dir\":\"/b\"}");

	memset(key, 'k', PX_KEY_MAX + 1);
	key[PX_KEY_MAX + 1] = '\0';
	snprintf(text, sizeof(text), "{\"op\":\"target-stop\",\"key\":\"%s\"}", key);
	check_reject(text);
	key[PX_KEY_MAX] = '\0';
	snprintf(text, sizeof(text), "{\"op\":\"target-stop\",\"key\":\"%s\"}", key);
	free(parse_ok(text));
}

#define TS "{\"op\":\"target-start\",\"key\":\"vm\","

static void test_sockets(void **state)
{
	char text[4096], path[256];
	size_t n;

	check_reject(TS "\"x\":1}");
	check_reject(TS "\"sockets\":null}");
	check_reject(TS "\"sockets\":{}}");
	check_reject(TS "\"sockets\":[]}");
	check_reject(TS "\"sockets\":[\"/a\"]}");
	check_reject(TS "\"sockets\":\"1=/a\"}");
	/* Bad port ids. */
	check_reject(TS "\"sockets\":{\"\":\"/a\"}}");
	check_reject(TS "\"sockets\":{\"-1\":\"/a\"}}");
	check_reject(TS "\"sockets\":{\"65536\":\"/a\"}}");
	check_reject(TS "\"sockets\":{\"x\":\"/a\"}}");
	check_reject(TS "\"sockets\":{\"12a\":\"/a\"}}");
	check_reject(TS "\"sockets\":{\"+5\":\"/a\"}}");
	check_reject(TS "\"sockets\":{\"1\":\"/a\",\"abc\":\"/b\"}}");
	/* Paths must be strings. */
	check_reject(TS "\"sockets\":{\"1\":1}}");
	check_reject(TS "\"sockets\":{\"1\":null}}");
	check_reject(TS "\"sockets\":{\"1\":[\"/a\"]}}");
	check_reject(TS "\"sockets\":{\"1\":\"/a\",\"2\":{}}}");
	/* Nine sockets. */
	n = snprintf(text, sizeof(text), TS "\"sockets\":{");
	for (int i = 0; i < 9; i++)
		n += snprintf(text + n, sizeof(text) - n, "%s\"%d\":\"/s%d\"", i ? "," : "", i, i);
	snprintf(text + n, sizeof(text) - n, "}}");
	check_reject(text);
	/* Paths of 108 bytes and more do not fit sun_path. */
	static const size_t lens[] = { 108, 109, 200 };

	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		memset(path, 'p', lens[i]);
		path[0] = '/';
		path[lens[i]] = '\0';
		snprintf(text, sizeof(text), TS "\"sockets\":{\"1\":\"%s\"}}", path);
		check_reject(text);
	}
}

#define SS "{\"op\":\"source-start\",\"key\":\"vm\","

static void check_reject_says(const char *text, const char *err_has);

static void test_source_start_bad(void **state)
{
	char text[8192], dir[CTL_DIR_MAX + 1];

	/* Target missing, or not a valid target. */
	check_reject(SS "\"dir\":\"/b\"}");
	check_reject(SS "\"target\":null,\"dir\":\"/b\"}");
	check_reject(SS "\"target\":\""
			"vm"
			"\",\"dir\":\"/b\"}");
	check_reject(SS "\"target\":[],\"dir\":\"/b\"}");
	check_reject(SS "\"target\":{},\"dir\":\"/b\"}");
	check_reject(SS "\"target\":{\"version\":2,\"key\":\"vm\",\"address\":\"198.18.0.2\","
			"\"port\":40123,\"ports\":[0]},\"dir\":\"/b\"}");
	check_reject(SS "\"target\":{\"version\":1,\"key\":\"vm\",\"address\":\"node2\","
			"\"port\":40123,\"ports\":[0]},\"dir\":\"/b\"}");
	check_reject(SS "\"target\":{\"version\":1,\"key\":\"vm\",\"address\":\"198.18.0.2\","
			"\"port\":0,\"ports\":[0]},\"dir\":\"/b\"}");
	check_reject(SS "\"target\":{\"version\":1,\"key\":\"vm\",\"address\":\"198.18.0.2\","
			"\"port\":40123,\"ports\":[]},\"dir\":\"/b\"}");
	/* The target JSON of another migration. */
	check_reject(SS "\"target\":" TARGET_JSON("vm-other") ",\"dir\":\"/b\"}");
	check_reject(SS "\"target\":" TARGET_JSON("VM") ",\"dir\":\"/b\"}");
	check_reject(SS "\"target\":" TARGET_JSON("v") ",\"dir\":\"/b\"}");
	/* dir missing or not a string. */
	check_reject(SS "\"target\":" TARGET_JSON("vm") "}");
	check_reject(SS "\"target\":" TARGET_JSON("vm") ",\"dir\":null}");
	check_reject(SS "\"target\":" TARGET_JSON("vm") ",\"dir\":1}");
	check_reject(SS "\"target\":" TARGET_JSON("vm") ",\"dir\":[\"/b\"]}");
	/* dir longer than PATH_MAX. */
	memset(dir, 'd', CTL_DIR_MAX);
	dir[0] = '/';
	dir[CTL_DIR_MAX] = '\0';
	snprintf(text, sizeof(text), SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"%s\"}", dir);
	check_reject(text);
	/* test_delay_first_ms is vmigd-test's: refused here as any unknown field. */
	check_reject_says(
		SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\",\"test_delay_first_ms\":250}",
		"source-start: unknown field \"test_delay_first_ms\" (it takes key, target, "
		"dir, bandwidth, convergence, tls, compress)");
}

static void test_source_start_key_message(void **state)
{
	struct ctl_request *req = malloc(sizeof(*req));
	char err[512] = "";

	assert_non_null(req);
	assert_int_equal(parse("{\"op\":\"source-start\",\"key\":\"alpha\",\"target\":" TARGET_JSON(
				       "beta") ",\"dir\":\"/b\"}",
			       req, err, sizeof(err)),
			 -EINVAL);
	/* Names both keys, so the operator sees which paste went wrong. */
	assert_non_null(strstr(err, "alpha"));
	assert_non_null(strstr(err, "beta"));
	free(req);
}

static void test_start_bandwidth(void **state)
{
	struct ctl_request *req;

	req = parse_ok(TS "\"sockets\":{\"1\":\"/a\"},\"bandwidth\":67108864}");
	assert_int_equal(req->op, CTL_TARGET_START);
	assert_int_equal(req->bandwidth, 67108864);
	free(req);
	/* Optional: no cap when left out, or 0. */
	req = parse_ok(TS "\"sockets\":{\"1\":\"/a\"}}");
	assert_int_equal(req->bandwidth, 0);
	free(req);
	req = parse_ok(TS "\"sockets\":{\"1\":\"/a\"},\"bandwidth\":0}");
	assert_int_equal(req->bandwidth, 0);
	free(req);
	req = parse_ok(SS
		       "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\",\"bandwidth\":125000000}");
	assert_int_equal(req->op, CTL_SOURCE_START);
	assert_int_equal(req->bandwidth, 125000000);
	free(req);
	req = parse_ok(SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\"}");
	assert_int_equal(req->bandwidth, 0);
	free(req);
	/* Ops without a cap refuse the field, as any other they do not take. */
	check_reject("{\"op\":\"target-stop\",\"key\":\"vm\",\"bandwidth\":5}");
}

static void test_bandwidth_ops(void **state)
{
	struct ctl_request *req;
	char text[256];

	req = parse_ok("{\"op\":\"bandwidth\",\"key\":\"vm-1\",\"bandwidth\":500000000}");
	assert_int_equal(req->op, CTL_BANDWIDTH);
	assert_string_equal(req->key, "vm-1");
	assert_int_equal(req->bandwidth, 500000000);
	free(req);
	/* 0 lifts the cap. */
	req = parse_ok("{\"op\":\"bandwidth\",\"key\":\"vm-1\",\"bandwidth\":0}");
	assert_int_equal(req->bandwidth, 0);
	free(req);
	snprintf(text, sizeof(text), "{\"op\":\"node-bandwidth\",\"bandwidth\":%llu}", VM_RATE_MAX);
	req = parse_ok(text);
	assert_int_equal(req->op, CTL_NODE_BANDWIDTH);
	assert_true(req->bandwidth == VM_RATE_MAX);
	free(req);
	req = parse_ok("{\"op\":\"node-bandwidth\",\"bandwidth\":0}");
	assert_int_equal(req->bandwidth, 0);
	free(req);
	check_op("{\"op\":\"metrics\"}\n", CTL_METRICS);
}

static void test_bandwidth_bad(void **state)
{
	static const char *const values[] = {
		"-1",
		"-67108864",
		"\"64Mi\"",
		"\"67108864\"",
		"1.5",
		"1e9",
		"67108864.0",
		"null",
		"true",
		"[1]",
		"{}",
		"1000000000000001",
		"9223372036854775807",
		"18446744073709551615",
		"99999999999999999999999",
	};
	static const char *const heads[] = {
		"{\"op\":\"bandwidth\",\"key\":\"vm\",\"bandwidth\":",
		"{\"op\":\"node-bandwidth\",\"bandwidth\":",
		TS "\"sockets\":{\"1\":\"/a\"},\"bandwidth\":",
		SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\",\"bandwidth\":",
	};
	struct ctl_request *req = malloc(sizeof(*req));
	char text[1024], err[512];
	int bad = 0;

	assert_non_null(req);
	for (size_t h = 0; h < sizeof(heads) / sizeof(heads[0]); h++)
		for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
			snprintf(text, sizeof(text), "%s%s}", heads[h], values[i]);
			bad += try_reject_len(text, strlen(text), text) < 0;
			/* The message names the field. */
			if (parse(text, req, err, sizeof(err)) == -EINVAL &&
			    !strstr(err, "bandwidth")) {
				print_error("%s: message does not name the field: %s\n", text, err);
				bad++;
			}
		}
	assert_int_equal(bad, 0);
	/* Required where it is the point of the request. */
	check_reject("{\"op\":\"bandwidth\",\"key\":\"vm\"}");
	check_reject("{\"op\":\"node-bandwidth\"}");
	/* bandwidth takes a valid key. */
	check_reject("{\"op\":\"bandwidth\",\"bandwidth\":1}");
	check_reject("{\"op\":\"bandwidth\",\"key\":\"a b\",\"bandwidth\":1}");
	check_reject("{\"op\":\"bandwidth\",\"key\":7,\"bandwidth\":1}");
	free(req);
}

/* source-start's "convergence": the backend, the mode and KubeVirt's policy fields. */
#define CV_HEAD SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\",\"convergence\":"

static void test_convergence(void **state)
{
	struct ctl_request *req;

	/* Without it: no monitor. */
	req = parse_ok(SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\"}");
	assert_false(req->converge);
	free(req);
	/* QMP with the defaults: predictive, nothing allowed, KubeVirt's timeouts. */
	req = parse_ok(CV_HEAD "{\"qmp\":\"/run/vm.qmp\"}}");
	assert_true(req->converge);
	assert_int_equal(req->conv.backend, CV_BACKEND_QMP);
	assert_string_equal(req->conv.qmp, "/run/vm.qmp");
	assert_int_equal(req->conv.policy.mode, CV_MODE_PREDICTIVE);
	assert_false(req->conv.policy.allow_auto_converge);
	assert_false(req->conv.policy.allow_post_copy);
	assert_false(req->conv.policy.allow_workload_disruption);
	assert_int_equal(req->conv.policy.completion_timeout_per_gib, 150);
	assert_int_equal(req->conv.policy.progress_timeout_s, 150);
	assert_int_equal(req->conv.policy.window_ms, 2000);
	free(req);
	/* libvirt, kubevirt mode; allowWorkloadDisruption follows allowPostCopy unless given. */
	req = parse_ok(CV_HEAD "{\"libvirt\":{\"domain\":\"vm1\",\"uri\":\"qemu:///system\"},"
			       "\"mode\":\"kubevirt\",\"policy\":{\"allowPostCopy\":true,"
			       "\"completionTimeoutPerGiB\":10,\"progressTimeout\":0,"
			       "\"maxDowntimeMs\":900}}}");
	assert_int_equal(req->conv.backend, CV_BACKEND_LIBVIRT);
	assert_string_equal(req->conv.domain, "vm1");
	assert_string_equal(req->conv.uri, "qemu:///system");
	assert_int_equal(req->conv.policy.mode, CV_MODE_KUBEVIRT);
	assert_true(req->conv.policy.allow_post_copy);
	assert_true(req->conv.policy.allow_workload_disruption);
	assert_int_equal(req->conv.policy.completion_timeout_per_gib, 10);
	assert_int_equal(req->conv.policy.progress_timeout_s, 0);
	assert_int_equal(req->conv.policy.max_downtime_ms, 900);
	free(req);
	req = parse_ok(CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"allowPostCopy\":true,"
			       "\"allowWorkloadDisruption\":false}}}");
	assert_false(req->conv.policy.allow_workload_disruption);
	free(req);
	/* The policy's bandwidth is the request's cap, given either way. */
	req = parse_ok(CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"bandwidth\":16777216}}}");
	assert_int_equal(req->bandwidth, 16777216);
	assert_int_equal(req->conv.policy.bandwidth, 16777216);
	free(req);
	req = parse_ok(SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\",\"bandwidth\":1000,"
							  "\"convergence\":{\"qmp\":\"/q\"}}");
	assert_int_equal(req->conv.policy.bandwidth, 1000);
	free(req);

	/* KubeVirt's options object as it serialises it: a Quantity bandwidth (whole MiB/s, half
	 * up), VEP 248's stall detector under experimental, fields vmigd does not use listed. */
	req = parse_ok(CV_HEAD "{\"qmp\":\"/q\",\"mode\":\"stall\",\"policy\":{"
			       "\"allowAutoConverge\":true,\"bandwidthPerMigration\":\"64Mi\","
			       "\"completionTimeoutPerGiB\":20,\"nodeDrainTaintKey\":\"k\","
			       "\"network\":null,\"experimental\":{\"compression\":\"zstd\","
			       "\"stallDetector\":{\"stallMargin\":5,\"stallProgressTimeout\":30,"
			       "\"ewmaAlpha\":\"0.5\",\"precopyPossibleFactor\":2,"
			       "\"searchLocalMinima\":false,\"future\":1}}}}}");
	assert_int_equal(req->conv.policy.mode, CV_MODE_STALL);
	assert_int_equal(req->conv.policy.bandwidth, 64ull << 20);
	assert_int_equal(req->conv.policy.completion_timeout_per_gib, 20);
	assert_int_equal(req->conv.policy.stall.margin_pct, 5);
	assert_int_equal(req->conv.policy.stall.window_s, 30);
	assert_int_equal(req->conv.policy.stall.ewma_alpha_pct, 50);
	assert_int_equal(req->conv.policy.stall.precopy_factor_pct, 200);
	assert_false(req->conv.policy.stall.local_minima);
	assert_int_equal(req->conv.policy.stall.switchover_timeout_s, 60);
	assert_string_equal(req->conv.ignored, "nodeDrainTaintKey, network, "
					       "experimental.compression, stallDetector.future");
	free(req);
	req = parse_ok(CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"bandwidthPerMigration\":\"1.4Mi\","
			       "\"shadow\":true}}}");
	assert_int_equal(req->conv.policy.bandwidth, 1ull << 20);
	assert_true(req->conv.policy.shadow);
	assert_string_equal(req->conv.ignored, "");
	free(req);
	req = parse_ok(CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"bandwidthPerMigration\":\"500k\"}}}");
	assert_int_equal(req->conv.policy.bandwidth, 1ull << 20); /* under 1 MiB/s: 1 */
	free(req);
	req = parse_ok(CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"bandwidthPerMigration\":\"0Mi\"}}}");
	assert_int_equal(req->conv.policy.bandwidth, 0);
	free(req);
}

static void test_convergence_bad(void **state)
{
	static const char *const bad[] = {
		CV_HEAD "\"qmp\"}",
		CV_HEAD "{}}",
		CV_HEAD "{\"qmp\":\"/q\",\"libvirt\":{\"domain\":\"d\"}}}",
		CV_HEAD "{\"qmp\":\"\"}}",
		CV_HEAD "{\"qmp\":7}}",
		CV_HEAD "{\"libvirt\":{}}}",
		CV_HEAD "{\"libvirt\":{\"domain\":\"d\",\"uri\":5}}}",
		CV_HEAD "{\"libvirt\":\"d\"}}",
		CV_HEAD "{\"qmp\":\"/q\",\"mode\":\"fast\"}}",
		CV_HEAD "{\"qmp\":\"/q\",\"mode\":1}}",
		CV_HEAD "{\"qmp\":\"/q\",\"extra\":1}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":[]}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"allowAutoConverge\":\"yes\"}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"allowAutoconverge\":true}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"progressTimeout\":-1}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"progressTimeout\":1.5}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"maxDowntimeMs\":2000001}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"evidenceWindowMs\":0}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"bandwidth\":\"64Mi\"}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"bandwidthPerMigration\":\"64Mbit\"}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"bandwidthPerMigration\":\"fast\"}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"bandwidthPerMigration\":\"1Mi\","
			"\"bandwidth\":1048576}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"stallDetector\":{\"stallmargin\":4}}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"stallDetector\":{\"ewmaAlpha\":1.5}}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"stallDetector\":{\"ewmaAlpha\":\"x\"}}}}",
		CV_HEAD
		"{\"qmp\":\"/q\",\"policy\":{\"stallDetector\":{\"stallProgressTimeout\":0}}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"experimental\":7}}}",
		CV_HEAD "{\"qmp\":\"/q\",\"policy\":{\"shadow\":1}}}",
		SS "\"target\":" TARGET_JSON(
			"vm") ",\"dir\":\"/b\",\"bandwidth\":1000,"
			      "\"convergence\":{\"qmp\":\"/q\",\"policy\":{\"bandwidth\":2000}}}",
	};
	int failed = 0;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		failed += try_reject_len(bad[i], strlen(bad[i]), bad[i]) < 0;
	assert_int_equal(failed, 0);
}

/* The exact first message each operation gives, so that its parser keeps the order of checks. */
static void test_messages(void **state)
{
	static const struct {
		const char *text, *msg;
	} cases[] = {
		{ "{}", "missing or bad \"op\"" },
		{ "[]", "request is not a JSON object" },
		{ "{\"op\":\"nope\"}", "unknown op \"nope\"" },
		{ "{\"op\":\"target-start\"}", "missing or bad \"key\" (a string)" },
		{ "{\"op\":\"target-start\",\"key\":\"vm\",\"bandwidth\":-1}",
		  "missing \"sockets\": give at least one PORTID=UNIXPATH" },
		{ TS "\"sockets\":{\"1\":\"/a\"},\"bandwidth\":-1}",
		  "\"bandwidth\" must not be negative (0 for no cap)" },
		{ "{\"op\":\"target-stop\",\"key\":\"a b\"}",
		  "invalid key \"a b\": use 1 to 128 characters of A-Z a-z 0-9 . _ -" },
		{ "{\"op\":\"source-stop\"}", "missing or bad \"key\" (a string)" },
		{ SS "\"bandwidth\":\"x\"}",
		  "missing \"target\" (the JSON that target start printed)" },
		{ SS "\"target\":" TARGET_JSON("vm") ",\"bandwidth\":1.5}",
		  "missing \"dir\" (the base directory)" },
		{ SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\",\"bandwidth\":1.5,"
						     "\"convergence\":7}",
		  "\"bandwidth\" must be an integer number of bytes/s (0 for no cap)" },
		{ CV_HEAD "{\"qmp\":\"/q\",\"x\":1}}",
		  "convergence: unknown field \"x\" (known: mode, qmp, libvirt, policy)" },
		{ SS "\"target\":" TARGET_JSON(
			  "vm") ",\"dir\":\"/b\",\"bandwidth\":5,"
				"\"convergence\":{\"qmp\":\"/q\",\"policy\":{\"bandwidth\":6}}}",
		  "\"bandwidth\" (5) and the policy's \"bandwidth\" (6) differ: give one" },
		{ "{\"op\":\"bandwidth\",\"bandwidth\":1}", "missing or bad \"key\" (a string)" },
		{ "{\"op\":\"bandwidth\",\"key\":\"vm\"}",
		  "missing \"bandwidth\" (bytes/s, 0 for no cap)" },
		{ "{\"op\":\"node-bandwidth\",\"key\":\"a b\"}",
		  "node-bandwidth: unknown field \"key\" (it takes bandwidth)" },
		{ "{\"op\":\"node-bandwidth\"}", "missing \"bandwidth\" (bytes/s, 0 for no cap)" },
		/* A misspelt field names the one it may have meant and the fields the op takes. */
		{ TS "\"sockets\":{\"1\":\"/a\"},\"bandwith\":1000}",
		  "target-start: unknown field \"bandwith\": did you mean \"bandwidth\"? (it takes "
		  "key, sockets, bandwidth, kubevirt, listen, tls)" },
		{ "{\"op\":\"source-stop\",\"KEY\":\"vm\"}",
		  "source-stop: unknown field \"KEY\": did you mean \"key\"? (it takes key)" },
		{ "{\"op\":\"status\",\"bogus\":1}",
		  "status: unknown field \"bogus\" (it takes no field but \"op\")" },
	};
	struct ctl_request *req = malloc(sizeof(*req));
	char err[512];
	int bad = 0;

	assert_non_null(req);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		err[0] = '\0';
		if (parse(cases[i].text, req, err, sizeof(err)) != -EINVAL ||
		    strcmp(err, cases[i].msg) != 0) {
			print_error("%s: \"%s\", want \"%s\"\n", cases[i].text, err, cases[i].msg);
			bad++;
		}
	}
	/* list, status and metrics take no field: anything beside "op" is refused. */
	check_reject("{\"op\":\"metrics\",\"key\":\"a b\",\"bandwidth\":-5}");
	check_reject("{\"op\":\"list\",\"sockets\":7}");
	free(req);
	assert_int_equal(bad, 0);
}

static char *big_request(size_t len)
{
	/* A long string where a field takes one: the size is checked before anything else. */
	static const char head[] = "{\"op\":\"target-stop\",\"key\":\"";
	static const char tail[] = "\"}\n";
	char *text = malloc(len + 1);

	assert_non_null(text);
	assert_true(len > sizeof(head) + sizeof(tail));
	memcpy(text, head, sizeof(head) - 1);
	memset(text + sizeof(head) - 1, 'x', len - (sizeof(head) - 1) - (sizeof(tail) - 1));
	memcpy(text + len - (sizeof(tail) - 1), tail, sizeof(tail) - 1);
	text[len] = '\0';
	return text;
}

static void test_too_large(void **state)
{
	char *text = big_request(CTL_REQUEST_MAX + 1);
	struct ctl_request *req;
	char err[512] = "";

	assert_int_equal(strlen(text), CTL_REQUEST_MAX + 1);
	check_reject(text);
	req = malloc(sizeof(*req));
	assert_non_null(req);
	assert_int_equal(parse(text, req, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "64 KiB"));
	free(text);
	text = big_request(1 << 20);
	check_reject(text);
	free(text);
	/* Exactly 64 KiB is not over the limit: refused for the key, not the size. */
	text = big_request(CTL_REQUEST_MAX);
	assert_int_equal(parse(text, req, err, sizeof(err)), -EINVAL);
	assert_null(strstr(err, "64 KiB"));
	assert_non_null(strstr(err, "invalid key"));
	free(text);
	free(req);
}

static void test_err_small_buffer(void **state)
{
	struct ctl_request *req = malloc(sizeof(*req));
	char err[8];

	assert_non_null(req);
	memset(err, 'z', sizeof(err));
	/* A short err buffer gets a truncated, terminated message, and nothing past it. */
	assert_int_equal(ctl_request_parse("{\"op\":\"nope\"}", 13, req, err, 6), -EINVAL);
	assert_int_equal(strlen(err), 5);
	assert_int_equal(err[6], 'z');
	assert_int_equal(err[7], 'z');
	free(req);
}

/*
 * What the client sent is echoed into some messages; the reply must still be one line
 * (doc/interfaces.md: "error":"one clear line"; vmigctl prints it as one line on stderr).
 */
static void test_err_one_line_with_newlines_in_input(void **state)
{
	static const char *const cases[] = {
		"{\"op\":\"list\\nstatus\"}",
		"{\"op\":\"target-stop\",\"key\":\"a\\nb\"}",
		TS "\"sockets\":{\"1\\n\":\"/a\"}}",
		TS "\"sockets\":{\"1\":\"/a\\n"
		   "pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp"
		   "pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp\"}}",
	};
	int bad = 0;

	/* All of them, so that one run names every message that breaks the line. */
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		bad += try_reject_len(cases[i], strlen(cases[i]), cases[i]) < 0;
	assert_int_equal(bad, 0);
}

/* A KEY is 1 to 128 of [A-Za-z0-9._-]: a NUL inside the JSON string is not the end of it. */
static void test_key_embedded_nul(void **state)
{
	check_reject("{\"op\":\"target-stop\",\"key\":\"vm\\u0000x\"}");
	/* Not "list" followed by junk. */
	check_reject("{\"op\":\"list\\u0000junk\"}");
	check_reject(SS "\"target\":{\"version\":1,\"key\":\"vm\\u0000x\",\"address\":"
			"\"198.18.0.2\",\"port\":40123,\"ports\":[0]},\"dir\":\"/b\"}");
}

static void test_error_reply(void **state)
{
	static const char *const msgs[] = {
		"no such migration",
		"",
		"quote \" backslash \\ slash /",
		"line\nbreak and \t tab",
		"\x01\x1f control",
		"k\xc3\xa9y",
	};

	for (size_t i = 0; i < sizeof(msgs) / sizeof(msgs[0]); i++) {
		char *reply = ctl_error_reply(msgs[i], 0);
		struct json_object *o, *v;
		size_t n;

		assert_non_null(reply);
		n = strlen(reply);
		assert_true(n > 0);
		/* One line: the only newline is the last byte. */
		assert_int_equal(reply[n - 1], '\n');
		assert_ptr_equal(strchr(reply, '\n'), reply + n - 1);
		assert_int_equal(strncmp(reply, "{\"ok\":false,\"error\":", 20), 0);
		o = json_tokener_parse(reply);
		assert_non_null(o);
		assert_true(json_object_is_type(o, json_type_object));
		assert_int_equal(json_object_object_length(o), 2);
		assert_true(json_object_object_get_ex(o, "ok", &v));
		assert_true(json_object_is_type(v, json_type_boolean));
		assert_false(json_object_get_boolean(v));
		assert_true(json_object_object_get_ex(o, "error", &v));
		assert_true(json_object_is_type(v, json_type_string));
		/* vmigctl prints the message as its one stderr line: control bytes become '?'. */
		{
			char want[64];
			size_t k;

			for (k = 0; msgs[i][k]; k++)
				want[k] = (unsigned char)msgs[i][k] < 0x20 ? '?' : msgs[i][k];
			want[k] = '\0';
			assert_string_equal(json_object_get_string(v), want);
		}
		json_object_put(o);
		free(reply);
	}
}

static void test_error_reply_exact(void **state)
{
	char *reply = ctl_error_reply("no such migration", 0);

	assert_non_null(reply);
	assert_string_equal(reply, "{\"ok\":false,\"error\":\"no such migration\"}\n");
	free(reply);
	/* A program (KubeVirt's shim) reads the errno's name. */
	reply = ctl_error_reply("unknown migration k", -ENOENT);
	assert_string_equal(
		reply, "{\"ok\":false,\"error\":\"unknown migration k\",\"code\":\"ENOENT\"}\n");
	free(reply);
}

/* KubeVirt mode and TLS per migration; KubeVirt's map on the source, with or without a key. */
static void test_kubevirt_fields(void **state)
{
	struct ctl_request *req;

	req = parse_ok("{\"op\":\"target-start\",\"key\":\"k\",\"sockets\":{\"49152\":\"/a\"},"
		       "\"kubevirt\":true,\"tls\":false}");
	assert_true(req->kubevirt);
	assert_int_equal(req->tls, PX_TLS_OFF);
	free(req);
	req = parse_ok("{\"op\":\"target-start\",\"key\":\"k\",\"sockets\":{\"49152\":\"/a\"}}");
	assert_false(req->kubevirt);
	assert_int_equal(req->tls, PX_TLS_DEFAULT);
	free(req);
	req = parse_ok("{\"op\":\"source-start\",\"key\":\"k\",\"dir\":\"/d\",\"tls\":true,"
		       "\"target\":{\"targetNodeAddress\":\"198.18.0.2\","
		       "\"targetDirectMigrationNodePorts\":{\"40123\":49152,\"40124\":0}}}");
	assert_int_equal(req->tls, PX_TLS_ON);
	assert_true(req->target.kubevirt);
	assert_string_equal(req->target.key, "k");
	assert_int_equal(req->target.nports, 2);
	free(req);
	check_reject("{\"op\":\"target-start\",\"key\":\"k\",\"sockets\":{\"1\":\"/a\"},"
		     "\"kubevirt\":1}");
	check_reject("{\"op\":\"target-start\",\"key\":\"k\",\"sockets\":{\"1\":\"/a\"},"
		     "\"tls\":\"off\"}");
	/* "listen": the TCP port per logical port, KubeVirt mode only, for ports it has. */
	req = parse_ok("{\"op\":\"target-start\",\"key\":\"k\",\"kubevirt\":true,"
		       "\"sockets\":{\"49152\":\"/a\",\"0\":\"/b\"},\"listen\":{\"0\":40002}}");
	assert_int_equal(req->nports, 2);
	for (unsigned int i = 0; i < 2; i++)
		assert_int_equal(req->ports[i].tcp, req->ports[i].id == 0 ? 40002 : 0);
	free(req);
#define TSK                                                                                        \
	"{\"op\":\"target-start\",\"key\":\"k\",\"kubevirt\":true,"                                \
	"\"sockets\":{\"49152\":\"/a\",\"0\":\"/b\"},"
	check_reject_says(TSK "\"listen\":[40001]}",
			  "\"listen\" must be an object of \"PORTID\": TCPPORT");
	check_reject_says("{\"op\":\"target-start\",\"key\":\"k\",\"sockets\":{\"49152\":"
			  "\"/a\"},\"listen\":{\"49152\":40001}}",
			  "\"listen\" needs \"kubevirt\"");
	check_reject_says(TSK "\"listen\":{\"49153\":40001}}",
			  "listen: port 49153 has no socket in \"sockets\"");
	check_reject_says(TSK "\"listen\":{\"x\":40001}}", "listen: bad port id \"x\"");
	check_reject_says(TSK "\"listen\":{\"0\":0}}",
			  "listen: the TCP port for port 0 must be 1 to 65535");
	check_reject_says(TSK "\"listen\":{\"0\":65536}}",
			  "listen: the TCP port for port 0 must be 1 to 65535");
	check_reject_says(TSK "\"listen\":{\"0\":\"40001\"}}",
			  "listen: the TCP port for port 0 must be 1 to 65535");
	check_reject_says(TSK "\"listen\":{\"0\":40001,\"00\":40002}}",
			  "listen: port 0 is listed twice");
	check_reject_says(TSK "\"listen\":{\"0\":40001,\"49152\":40001}}",
			  "listen: TCP port 40001 is given to ports 0 and 49152");
#undef TSK
	/* KubeVirt's map for another key. */
	check_reject("{\"op\":\"source-start\",\"key\":\"k\",\"dir\":\"/d\",\"target\":{"
		     "\"targetNodeAddress\":\"198.18.0.2\",\"key\":\"j\","
		     "\"targetDirectMigrationNodePorts\":{\"40123\":49152}}}");
}

/* The refusal of text, which must say err_has. */
static void check_reject_says(const char *text, const char *err_has)
{
	struct ctl_request req;
	char err[512] = "";

	assert_int_equal(parse(text, &req, err, sizeof(err)), -EINVAL);
	if (!strstr(err, err_has))
		fail_msg("%s: refused with \"%s\", not \"%s\"", text, err, err_has);
	check_reject(text);
}

/* json-c keeps the last of a key given twice; the request is refused instead, at any depth. */
static void test_duplicate_keys(void **state)
{
	char key[16];

	check_reject_says("{\"op\":\"list\",\"op\":\"target-stop\"}", "the key \"op\" twice");
	check_reject_says("{\"op\":\"target-stop\",\"key\":\"a\",\"key\":\"b\"}\n",
			  "the key \"key\" twice");
	check_reject_says("{\"op\":\"target-start\",\"key\":\"k\",\"sockets\":{\"1\":\"/a\","
			  "\"1\":\"/b\"}}",
			  "the key \"1\" twice");
	check_reject_says("{\"op\":\"list\",\"x\":[1,{\"a\":{\"b\":1,\"b\":2}}]}",
			  "the key \"b\" twice");
	/* Compared as json-c decodes them: escapes, single quotes, surrogate pairs. */
	check_reject_says("{\"op\":\"list\",\"\\u006fp\":\"target-stop\"}", "the key \"op\" twice");
	check_reject_says("{\"op\":\"list\",'op':'target-stop'}", "the key \"op\" twice");
	check_reject_says("{\"op\":\"list\",\"\\ud83d\\ude00\":1,\"\xf0\x9f\x98\x80\":2}", "twice");
	check_reject_says("{\"op\":\"list\"/* } */,\"op\":\"status\"}", "the key \"op\" twice");
	/* The same name at different levels, or in sibling objects, is no duplicate. */
	check_op("{\"op\":\"source-start\",\"key\":\"vm\",\"dir\":\"/d\",\"target\":" TARGET_JSON(
			 "vm") "}",
		 CTL_SOURCE_START);
	check_op("{\"op\":\"list\"/* \"op\":\"x\" */}", CTL_LIST);
	check_op("{\"op\":\"list\"} // \"op\"\n", CTL_LIST);
	/* A comment ends where json-c ends it: not at a '/' after "**" (found by fuzz-ctl). */
	check_op("{\"op\":\"list\" /* **/ ,\"op\":\"target-stop\" */}", CTL_LIST);
	check_reject_says("{\"op\":\"list\" /* */ ,\"op\":\"target-stop\" /**/}",
			  "the key \"op\" twice");

	/* The scanner by itself. */
	assert_int_equal(ctl_json_duplicate_key("{}", 2, key, sizeof(key)), 0);
	assert_int_equal(ctl_json_duplicate_key("[{\"a\":1},{\"a\":1}]", 17, key, sizeof(key)), 0);
	assert_int_equal(ctl_json_duplicate_key("{\"a\":{\"a\":1}}", 13, key, sizeof(key)), 0);
	assert_int_equal(ctl_json_duplicate_key("{\"ab\":1,\"a\":1,\"b\":1}", 21, key, sizeof(key)),
			 0);
	assert_int_equal(ctl_json_duplicate_key("{\"a\":1,\"a\":1}", 13, key, sizeof(key)), 1);
	assert_string_equal(key, "a");
	assert_int_equal(
		ctl_json_duplicate_key("{\"a\\\"\":1,\"a\\u0022\":1}", 21, key, sizeof(key)), 1);
	assert_string_equal(key, "a\"");
	/* Cut to fit. */
	assert_int_equal(ctl_json_duplicate_key("{\"abcdef\":1,\"abcdef\":2}", 23, key, 4), 1);
	assert_string_equal(key, "abc");
	/* Not JSON: refused, not crashed on. */
	assert_int_equal(ctl_json_duplicate_key("{", 1, key, sizeof(key)), -EINVAL);
	assert_int_equal(ctl_json_duplicate_key("{\"a", 3, key, sizeof(key)), -EINVAL);
	assert_int_equal(ctl_json_duplicate_key("{\"a\\", 4, key, sizeof(key)), -EINVAL);
	assert_int_equal(ctl_json_duplicate_key("{\"\\u12\"}", 8, key, sizeof(key)), -EINVAL);
	assert_int_equal(ctl_json_duplicate_key("{]", 2, key, sizeof(key)), -EINVAL);
	assert_int_equal(ctl_json_duplicate_key("/* x", 4, key, sizeof(key)), -EINVAL);
}

/* A request is UTF-8; a reply is made so whatever its strings held. */
static void test_utf8(void **state)
{
	static const struct {
		const char *in, *out;
	} fix[] = {
		{ "plain", "plain" },
		{ "k\xc3\xa9y \xe2\x82\xac \xf0\x9f\x98\x80",
		  "k\xc3\xa9y \xe2\x82\xac \xf0\x9f\x98\x80" },
		{ "a\xff"
		  "b",
		  "a\\ufffdb" },
		{ "\xc0\xaf", "\\ufffd\\ufffd" },			/* overlong '/' */
		{ "\xed\xa0\x80", "\\ufffd\\ufffd\\ufffd" },		/* a surrogate */
		{ "\xf4\x90\x80\x80", "\\ufffd\\ufffd\\ufffd\\ufffd" }, /* above U+10FFFF */
		{ "cut \xe2\x82", "cut \\ufffd\\ufffd" },
		{ "\x80", "\\ufffd" },
	};
	char *reply;

	check_reject_says("{\"op\":\"target-stop\",\"key\":\"\xff\"}", "not valid UTF-8");
	check_reject_says("{\"op\":\"target-stop\",\"key\":\"\xc0\xaf\"}", "not valid UTF-8");
	check_reject_says("{\"op\":\"target-stop\",\"key\":\"\xed\xa0\x80\"}", "not valid UTF-8");
	/* Valid UTF-8 gets as far as the key's own check. */
	check_reject_says("{\"op\":\"target-stop\",\"key\":\"k\xc3\xa9y\"}", "invalid key");

	for (size_t i = 0; i < sizeof(fix) / sizeof(fix[0]); i++) {
		char *t = strdup(fix[i].in), *o;

		assert_non_null(t);
		o = ctl_json_utf8_fix(t);
		assert_non_null(o);
		assert_string_equal(o, fix[i].out);
		free(o);
	}
	/* A reply carrying bytes from elsewhere: still JSON, now valid UTF-8. */
	reply = ctl_error_reply("cannot open /run/\xff\xfe: gone", 0);
	assert_non_null(reply);
	assert_string_equal(
		reply, "{\"ok\":false,\"error\":\"cannot open \\/run\\/\\ufffd\\ufffd: gone\"}\n");
	free(reply);
}

/* vmigd-test's test_delay_first_ms (ctl_test_init(), which adds it): a hook holding back each
 * port's first connection. Runs last: the field, once added, stays for the process. */
static void test_test_build_field(void **state)
{
	char arg0[] = "vmigd-test", *argv[] = { arg0, NULL };
	struct ctl_request *req;
	int argc = 1;

	assert_int_equal(ctl_test_init(&argc, argv), 0);
	req = parse_ok(
		SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\",\"test_delay_first_ms\":250}");
	assert_non_null(req->hook.hold_ms);
	assert_int_equal(req->hook.hold_ms(req->hook.arg, 49152, 0), 250);
	assert_int_equal(req->hook.hold_ms(req->hook.arg, 49152, 1), 0);
	assert_int_equal(req->hook.hold_ms(req->hook.arg, 0, 0), 250);
	free(req);
	/* Optional, and 0 holds nothing back. */
	req = parse_ok(SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\"}");
	assert_null(req->hook.hold_ms);
	free(req);
	req = parse_ok(
		SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\",\"test_delay_first_ms\":0}");
	assert_null(req->hook.hold_ms);
	free(req);
	req = parse_ok(SS "\"target\":" TARGET_JSON(
		"vm") ",\"dir\":\"/b\",\"test_delay_first_ms\":600000}");
	assert_int_equal(req->hook.hold_ms(req->hook.arg, 1, 0), 600000);
	free(req);
	check_reject_says(
		SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\",\"test_delay_first_ms\":-1}",
		"\"test_delay_first_ms\" must be 0..600000");
	check_reject(SS "\"target\":" TARGET_JSON(
		"vm") ",\"dir\":\"/b\",\"test_delay_first_ms\":600001}");
	check_reject(SS "\"target\":" TARGET_JSON(
		"vm") ",\"dir\":\"/b\",\"test_delay_first_ms\":4294967296}");
	check_reject(SS "\"target\":" TARGET_JSON(
		"vm") ",\"dir\":\"/b\",\"test_delay_first_ms\":\"100\"}");
	check_reject(
		SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\",\"test_delay_first_ms\":1.5}");
	check_reject(
		SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\",\"test_delay_first_ms\":null}");
	check_reject(
		SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\",\"test_delay_first_ms\":true}");
	/* Other ops do not take it; a typo names it, and the list has it. */
	check_reject_says("{\"op\":\"target-stop\",\"key\":\"vm\",\"test_delay_first_ms\":1}",
			  "target-stop: unknown field \"test_delay_first_ms\" (it takes key)");
	check_reject_says(
		SS "\"target\":" TARGET_JSON("vm") ",\"dir\":\"/b\",\"test_delay_firstms\":1}",
		"did you mean \"test_delay_first_ms\"? (it takes key, target, dir, bandwidth, "
		"convergence, tls, compress, test_delay_first_ms)");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_target_start),
		cmocka_unit_test(test_target_start_limits),
		cmocka_unit_test(test_stop_ops),
		cmocka_unit_test(test_takeover),
		cmocka_unit_test(test_source_start),
		cmocka_unit_test(test_list_status),
		cmocka_unit_test(test_trailing),
		cmocka_unit_test(test_duplicate_keys),
		cmocka_unit_test(test_utf8),
		cmocka_unit_test(test_not_json),
		cmocka_unit_test(test_not_object),
		cmocka_unit_test(test_op),
		cmocka_unit_test(test_key),
		cmocka_unit_test(test_sockets),
		cmocka_unit_test(test_source_start_bad),
		cmocka_unit_test(test_convergence),
		cmocka_unit_test(test_convergence_bad),
		cmocka_unit_test(test_messages),
		cmocka_unit_test(test_source_start_key_message),
		cmocka_unit_test(test_start_bandwidth),
		cmocka_unit_test(test_bandwidth_ops),
		cmocka_unit_test(test_bandwidth_bad),
		cmocka_unit_test(test_too_large),
		cmocka_unit_test(test_err_small_buffer),
		cmocka_unit_test(test_err_one_line_with_newlines_in_input),
		cmocka_unit_test(test_key_embedded_nul),
		cmocka_unit_test(test_error_reply),
		cmocka_unit_test(test_error_reply_exact),
		cmocka_unit_test(test_kubevirt_fields),
		/* last: it adds vmigd-test's field to the parser for good */
		cmocka_unit_test(test_test_build_field),
	};

	return cmocka_run_group_tests_name("ctl_proto", tests, NULL, NULL);
}
