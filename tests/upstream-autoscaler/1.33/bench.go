package main

import "k8s.io/autoscaler/cluster-autoscaler/cloudprovider"

var wrapCloudProvider func(cloudprovider.CloudProvider) cloudprovider.CloudProvider
